"""The targets shipped for task queues (killpoint.harness.libs): Celery, RQ, Huey, arq and Dramatiq, each
run by that library's own worker on a real broker (Redis, and RabbitMQ for Celery).

As for the durable-execution libraries (test_libs.py): the naive target (a new idempotency key per
execution) must be caught by its crash matrix -- exit 1, ``no_duplicate_effects`` alone -- and the
keyed target (a stable key, and a guard against a task delivered again) must be valid on the whole
matrix with every declared point fired. Every run leaves nothing in the broker: not after a matrix,
not after an interrupted run.

A library that is not installed skips its tests (``KILLPOINT_REQUIRE_LIBS=1`` makes them fail), and
so does a broker that is not running here (``KILLPOINT_REQUIRE_BROKERS=1`` makes them fail).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from test_libs import assert_keyed_valid_everywhere, assert_naive_caught, matrix, need

KILLPOINT = [sys.executable, "-m", "killpoint.harness.cli"]


def _redis():
    from killpoint.harness.libs import brokers

    need("redis")
    try:
        return brokers.redis_client(brokers.require_redis())
    except Exception as exc:  # noqa: BLE001 - InvalidTarget: the broker is not running
        if os.environ.get("KILLPOINT_REQUIRE_BROKERS") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_BROKERS=1 but {exc}", pytrace=False)
        pytest.skip(str(exc))


def _amqp() -> None:
    from killpoint.harness.libs import brokers

    try:
        brokers.require_amqp()
    except Exception as exc:  # noqa: BLE001
        if os.environ.get("KILLPOINT_REQUIRE_BROKERS") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_BROKERS=1 but {exc}", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture
def redis_client():
    return _redis()


def namespaces(out: dict) -> list[str]:
    """The namespace each run of a matrix used (its run id, as TargetRun.namespace spells it)."""
    return [r["run_id"].replace("-", "_") for r in out["results"]]


def assert_nothing_left(client, out: dict) -> None:
    for ns in namespaces(out):
        assert list(client.scan_iter(match=f"*{ns}*", count=1000)) == [], ns


# -- Celery -----------------------------------------------------------------------------------------


def test_celery_naive_matrix_exits_1_on_the_duplicate_a_redelivered_task_applies(redis_client):
    need("celery")
    code, out = matrix("celery:naive")
    assert_naive_caught(code, out, same_step=False)
    caught = {v["schedule"] for v in out["violations"]}
    # killed after its call and before its ack, the task is delivered again after the visibility
    # timeout; paused, it is delivered again while frozen, and runs on when resumed
    assert {"A@charge.after_call:kill", "A@charge.stored:kill", "A@charge.after_call:1*pause"} <= caught
    assert_nothing_left(redis_client, out)


def test_celery_keyed_matrix_is_valid_with_every_declared_point_fired(redis_client):
    need("celery")
    code, out = matrix("celery:keyed")
    assert_keyed_valid_everywhere("celery:keyed", code, out)
    assert_nothing_left(redis_client, out)


def test_celery_on_rabbitmq_naive_is_caught_and_keyed_is_valid(redis_client):
    """RabbitMQ requeues what a killed worker held at once, what a frozen one held once its missed
    heartbeats close its connection."""
    need("celery")
    _amqp()
    code, out = matrix("celery:naive:amqp", "--points", "after_call", "--steps", "charge")
    assert_naive_caught(code, out)
    assert {v["schedule"] for v in out["violations"]} == {"A@charge.after_call:kill", "A@charge.after_call:1*pause"}
    code, out = matrix("celery:keyed:amqp", "--steps", "charge", "--actions", "kill")
    assert (code, out["valid"], out["unknown"]) == (0, True, []), (out["unknown"], out["violations"])
    assert all(not r["unfired"] for r in out["results"])
    assert_nothing_left(redis_client, out)
    from killpoint.harness.libs import brokers

    for ns in namespaces(out):
        assert brokers.amqp_queue_depth(brokers.amqp_url(), f"kp.{ns}") is None  # the queue is gone


def test_celery_on_rabbitmq_a_worker_killed_in_its_next_task_does_not_keep_the_acked_one_in_hand(redis_client):
    """Protects: on RabbitMQ the workers keep the tasks they received and have not acknowledged in a
    set (RabbitMQ does not say what its consumers hold), and an acknowledged task left it in the
    hub's next batch of callbacks. When the next task's delivery was read first (in the same read of
    the socket) and the worker was killed in it, the acknowledged task stayed in the set for ever:
    the order was done and no worker could see it, and the run waited out its 30 s bound (1 run in
    6; the verdict came from "every step had settled"). Whether that read happens is timing, so this
    runs the schedule several times and asks that each ended because the work was done."""
    need("celery")
    _amqp()
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.targets import declared

    schedule = parse("A@charge.after_call:kill", points=frozenset(declared("celery:keyed:amqp").points))
    with Session() as session:
        results = [session.run(RunConfig(schedule=schedule, target="celery:keyed:amqp", seed=seed))
                   for seed in range(8)]
    for r in results:
        assert (r.valid, r.unfired) == (True, ()), r.verdict
        assert not r.history.bound_hit, [e.kind for e in r.history.events if e.process == "harness"]


def test_celery_pause_is_redelivered_to_another_worker_while_the_first_is_frozen(redis_client):
    """The frozen worker's task runs in another worker between the freeze and the resume: a real
    redelivery, not a run that waited for the frozen worker."""
    need("celery")
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.targets import declared

    schedule = parse("A@charge.before_call:1*pause", points=frozenset(declared("celery:keyed").points))
    with Session() as session:
        r = session.run(RunConfig(schedule=schedule, target="celery:keyed"))
    assert (r.valid, r.unfired) == (True, ()), r.verdict
    events = list(r.history.events)
    stop = next(e.index for e in events if e.kind == "stop" and e.get("worker") == "A")
    cont = next(e.index for e in events if e.kind == "cont" and e.get("worker") == "A")
    elsewhere = [e for e in events[stop:cont] if e.kind == "point" and e.get("point") == "prerun"
                 and e.get("step") == "charge" and e.process != "A"]
    assert elsewhere, [(e.process, e.kind, dict(e.data)) for e in events]


def _broker_sockets() -> list[tuple[int, tuple]]:
    """This process's TCP connections to a broker port (Redis's, RabbitMQ's): (fd, peer)."""
    import socket

    from killpoint.harness.libs import brokers

    ports = {urlsplit(brokers.redis_url()).port or 6379, urlsplit(brokers.amqp_url()).port or 5672}
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(fd))
        except OSError:
            continue
        try:
            peer = sock.getpeername()
        except OSError:
            peer = ()
        finally:
            sock.detach()
        if peer and peer[1] in ports:
            out.append((int(fd), peer))
    return out


@pytest.mark.parametrize("kind", ["redis", "amqp"])
def test_celery_setup_leaves_no_broker_connection_open_in_the_harness(redis_client, kind):
    """Protects: the Celery target's setup sent the order through Celery's pools and left an AMQP
    connection and the result backend's subscription open in the harness; a matrix's runners, forked
    after it, inherited them, two read one socket, and a matrix on RabbitMQ hung for ever. Only the
    one Redis client of this process (brokers.redis_client, made again in a forked process) stays."""
    need("celery")
    if kind == "amqp":
        _amqp()
    from killpoint.harness.declaration import TargetRun
    from killpoint.harness.libs import brokers
    from killpoint.harness.libs import celery as celery_target
    from killpoint.harness.libs.common import order_workload

    brokers.redis_client(brokers.require_redis())  # this process's own client, connected before
    before = _broker_sockets()
    run = TargetRun(run_id="t", run_dir="", namespace=f"kp_test_setup_{kind}_{os.getpid()}",
                    workload=order_workload(0), downstream_url="http://127.0.0.1:1", store="sqlite", seed=0)
    celery_target.setup(run, kind=kind, keyed=False)
    try:
        assert len(celery_target._metas(run.state)) == 0  # sent, not yet run
        left = [s for s in _broker_sockets() if s not in before]
        assert left == [], left
    finally:
        celery_target.teardown(run)
    assert list(redis_client.scan_iter(match=f"*{run.namespace}*")) == []


def test_an_unreachable_redis_is_one_line_naming_the_variable_exit_2():
    need("celery")
    env = {**os.environ, "KILLPOINT_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = subprocess.run([*KILLPOINT, "replay", "A@charge.after_call:kill", "--target", "celery:naive", "-q"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "KILLPOINT_REDIS_URL" in lines[0] and "127.0.0.1:1" in lines[0], lines


def test_an_unreachable_rabbitmq_is_one_line_naming_the_variable_exit_2(redis_client):
    need("celery")
    env = {**os.environ, "KILLPOINT_AMQP_URL": "amqp://guest:guest@127.0.0.1:1//"}
    done = subprocess.run([*KILLPOINT, "replay", "A@charge.after_call:kill", "--target", "celery:naive:amqp",
                           "-q"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "KILLPOINT_AMQP_URL" in lines[0] and "guest:guest" not in lines[0], lines


@pytest.mark.parametrize("target", ["celery:keyed", "dramatiq:keyed", "arq:keyed", "rq:keyed", "huey:keyed"])
def test_an_interrupted_run_leaves_nothing_in_the_broker(redis_client, target):
    """Ctrl-C while a worker is frozen (the pause waits out a redelivery): the run's keys are gone
    once the command exited 130."""
    need(target.split(":")[0])
    before = set(redis_client.scan_iter(match="*killpoint_run*", count=1000))
    proc = subprocess.Popen([*KILLPOINT, "replay", "A@reserve.before_call:1*pause", "--target", target, "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen: set = set()
        while proc.poll() is None and not seen:  # the run's first keys: it is under way
            seen = set(redis_client.scan_iter(match=f"*killpoint_run*_p{proc.pid}_*", count=1000)) - before
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seen, "the run made no key before it ended"
    assert proc.returncode == 130
    spaces = {re.search(r"killpoint_run\w+", k.decode()).group(0) for k in seen}
    left = [k for ns in spaces for k in redis_client.scan_iter(match=f"*{ns}*", count=1000)]
    assert left == []


def test_loading_the_targets_module_imports_no_queue_library():
    code = ("import sys, killpoint.harness.targets, killpoint.harness.libs, killpoint.harness.libs.brokers\n"
            "print(sorted(m for m in ('celery', 'rq', 'huey', 'arq', 'dramatiq', 'kombu', 'redis') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]


# -- Dramatiq ---------------------------------------------------------------------------------------


def test_dramatiq_naive_matrix_exits_1_on_the_duplicate_a_requeued_message_applies(redis_client):
    need("dramatiq")
    code, out = matrix("dramatiq:naive")
    # a frozen worker resumed finishes its message and enqueues the pipeline's next one again
    assert_naive_caught(code, out, same_step=False)
    # requeued once the worker's heartbeat stopped: killed after the effect and before the ack, or frozen
    assert {v["schedule"] for v in out["violations"]} == {
        f"A@{step}.{point}" for step in ("reserve", "charge")
        for point in ("after_call:kill", "stored:kill", "before_call:1*pause", "after_call:1*pause")}
    assert_nothing_left(redis_client, out)


def test_dramatiq_keyed_matrix_is_valid_with_every_declared_point_fired(redis_client):
    need("dramatiq")
    code, out = matrix("dramatiq:keyed")
    assert_keyed_valid_everywhere("dramatiq:keyed", code, out)
    assert_nothing_left(redis_client, out)


# -- arq --------------------------------------------------------------------------------------------


def test_arq_naive_matrix_exits_1_on_the_duplicate_a_job_taken_again_applies(redis_client):
    need("arq")
    code, out = matrix("arq:naive")
    assert_naive_caught(code, out, same_step=False)
    # taken again once its in-progress key expired: killed after the effect and before arq recorded
    # the result, or frozen
    assert {f"A@{step}.{point}" for step in ("reserve", "charge")
            for point in ("after_call:kill", "ended:kill", "after_call:1*pause")} \
        <= {v["schedule"] for v in out["violations"]}
    assert_nothing_left(redis_client, out)


def test_arq_keyed_matrix_is_valid_with_every_declared_point_fired(redis_client):
    need("arq")
    code, out = matrix("arq:keyed")
    assert_keyed_valid_everywhere("arq:keyed", code, out)
    assert_nothing_left(redis_client, out)


# -- RQ ---------------------------------------------------------------------------------------------


# RQ's own record (history()) judged beside the ledger: version_chain and legal_transitions
RQ_JUDGED = {"no_duplicate_effects", "effects_accounted", "terminates", "version_chain", "legal_transitions"}


def assert_rq_history_judged(out: dict) -> None:
    """Every run judged by RQ's record as well as the ledger: 5 of 15, where the job statuses alone
    gave 3; the lease invariants have no fence of RQ's to judge."""
    judged = {name for name, n in out["invariants"].items() if n["checked"]}
    assert judged == RQ_JUDGED, judged
    assert all(out["invariants"][name]["checked"] == out["runs"] for name in RQ_JUDGED), out["invariants"]
    assert out["judged"] == 5


def test_rq_naive_matrix_exits_1_on_the_duplicate_an_abandoned_job_retried_applies(redis_client):
    need("rq")
    code, out = matrix("rq:naive")
    assert_naive_caught(code, out)
    assert_rq_history_judged(out)
    # abandoned once its execution's heartbeat expired, and retried (Retry(max=3)): killed after the
    # effect and before RQ recorded the success, or frozen
    assert {f"A@{step}.{point}" for step in ("reserve", "charge")
            for point in ("after_call:kill", "before_call:1*pause", "after_call:1*pause")} \
        <= {v["schedule"] for v in out["violations"]}
    assert_nothing_left(redis_client, out)
    # this matrix's own runs only: another test's run may be alive beside it (pytest -n 2)
    ours = namespaces(out)
    assert not [m for m in redis_client.smembers("rq:workers") if any(ns in m.decode() for ns in ours)]


def test_rq_keyed_matrix_is_valid_with_every_declared_point_fired(redis_client):
    need("rq")
    code, out = matrix("rq:keyed")
    assert_keyed_valid_everywhere("rq:keyed", code, out)
    assert_rq_history_judged(out)
    # each pause: the frozen execution's late success, which RQ accepts, is in the history
    assert out["exercise"]["late_writes_accepted"] == out["exercise"]["pauses"] > 0, out["exercise"]
    assert_nothing_left(redis_client, out)


# -- RQ's record as store events (queue_history.rq_events), on hand-written records -----------------


def rq_history(results, created_at=100.0, open_executions=(), step="charge"):
    """The mapping's rows through the parse boundary a target's history() goes through, merged into
    a history as the run loop merges them. Times are epoch seconds; worker names ``space-A``."""
    from killpoint.harness.events import parse_store_row
    from killpoint.harness.history import merge
    from killpoint.harness.hooks import history_problem
    from killpoint.harness.libs.queue_history import rq_events

    rows = rq_events("order-1", step, created_at=created_at, results=results, open_executions=open_executions,
                     worker_of=lambda name: name.removeprefix("space-"), offset_ns=0)
    for n, row in enumerate(rows):
        parse_store_row(row, index=n)
        assert history_problem(row) is None, row
    return rows, merge({}, rows, [], [], owns_state=True)


def result(entry, kind, worker, execution, started, ended):
    return {"id": entry, "type": kind, "worker": worker and f"space-{worker}", "execution": execution,
            "started": started, "ended": ended}


def chain(rows):
    return [(r["kind"], r.get("from_state"), r["to_state"], r["state_version"], r.get("worker")) for r in rows]


def judged(h):
    from killpoint.harness.checkers import check_all

    return {r.invariant: r for r in check_all(h).results}


def test_rq_history_shows_a_frozen_executions_late_success_after_its_takeover_never_as_a_fork():
    """What a pause at charge leaves in RQ's record (seen in a real run): A's execution frozen, RQ
    abandons it and B runs the job again and succeeds; A, resumed, succeeds too, and RQ appends its
    result after B's. A stale write RQ accepts: with no fence in RQ's record it is a commit after B's,
    never a fork or an illegal transition that a correct keyed target would be reported for."""
    from killpoint.harness.libs.queue_history import final_states_of

    rows, h = rq_history([result("102738-0", 1, "B", "e2", 102.719, 102.736),
                          result("102763-0", 1, "A", "e1", 100.546, 102.761)])
    assert chain(rows) == [("created", None, "pending", 1, None),
                           ("claimed", "pending", "running", 2, "A"),
                           ("claimed", "running", "running", 3, "B"),  # B took the job over
                           ("committed", "running", "succeeded", 4, "B"),
                           ("committed", "running", "succeeded", 5, "A")]  # A's late success, accepted
    assert [r.get("execution_id") for r in rows] == [None, "e1", "e2", "e2", "e1"]
    assert rows[1]["t"] == 100_546_000_000 and rows[-1]["t"] == 102_761_000_000
    assert not any(k in r for r in rows for k in ("fence", "lease_version", "attempt"))  # RQ records none
    results = judged(h)
    for name in ("version_chain", "legal_transitions"):
        assert (results[name].valid, results[name].judged) == (True, True), results[name]
    for name in ("fence_rises", "lease_fenced", "stale_writes_rejected"):
        assert results[name].judged is False, results[name]
    assert final_states_of(rows, [("order-1", "charge"), ("order-1", "reserve")]) == {
        ("order-1", "charge"): "succeeded", ("order-1", "reserve"): "pending"}


def test_rq_history_leaves_an_abandoned_execution_it_no_longer_knows_out_and_claims_an_open_one():
    """A killed worker's execution: RQ's registry still names it, its hash (its worker and start)
    expired with its heartbeat, and it has no result: no claim is made up for it. An execution whose
    hash still lives (in flight when the record is read) is a claim with its worker."""
    rows, h = rq_history([result("103000-0", 1, "B", "e2", 102.9, 102.95)], open_executions=[{"id": "e1"}])
    assert chain(rows) == [("created", None, "pending", 1, None), ("claimed", "pending", "running", 2, "B"),
                           ("committed", "running", "succeeded", 3, "B")]
    assert rows[-1]["lapsed_executions"] == ["e1"]
    assert judged(h)["version_chain"].valid is True
    rows, _ = rq_history([], open_executions=[{"id": "e3", "worker": "space-C", "started": 101.0}])
    assert chain(rows) == [("created", None, "pending", 1, None), ("claimed", "pending", "running", 2, "C")]


def test_rq_history_maps_a_retry_and_a_failure_by_rqs_maintenance():
    """A job that returned Retry is scheduled again and claimed from there; a job abandoned with no
    retries left is failed by RQ's maintenance, with no worker and no execution (from started)."""
    rows, h = rq_history([result("101000-0", 4, "A", "e1", 100.5, 100.9),
                          result("104000-0", 2, "", None, None, None)],
                         open_executions=[{"id": "e2"}])
    assert chain(rows) == [("created", None, "pending", 1, None), ("claimed", "pending", "running", 2, "A"),
                           ("committed", "running", "retry_scheduled", 3, "A"),
                           ("committed", "running", "failed", 4, None)]
    assert rows[3]["t"] == 104_000_000_000  # the stream entry's own time: RQ gave it no end
    assert judged(h)["legal_transitions"].valid is True


@pytest.mark.parametrize("results, says", [
    # two results of one execution: a second outcome of a job RQ had recorded as succeeded
    ([result("101000-0", 1, "A", "e1", 100.5, 100.9), result("101100-0", 1, "A", "e1", 100.5, 101.0)],
     "moved it succeeded -> succeeded"),
    # an execution started after RQ recorded the job's success: a finished job run again
    ([result("101000-0", 1, "A", "e1", 100.5, 100.9), result("102000-0", 1, "B", "e2", 101.5, 101.9)],
     "moved it succeeded -> running"),
    # ... or after its final failure
    ([result("101000-0", 2, "A", "e1", 100.5, 100.9), result("102000-0", 1, "B", "e2", 101.5, 101.9)],
     "moved it failed -> running"),
])
def test_rq_history_that_runs_a_finished_job_again_breaks_legal_transitions(results, says):
    """What RQ's record can show that the table refuses. (RQ keeps no version: state_version is the
    record's order and version_chain holds by construction; legal_transitions is what judges.)"""
    from killpoint.harness.checkers import legal_transitions

    _, h = rq_history(results)
    r = legal_transitions(h)
    assert r.valid is False and says in r.violations[0].detail, r


def test_rq_history_refuses_a_result_type_it_does_not_know():
    from killpoint.harness.libs.queue_history import rq_events

    with pytest.raises(ValueError, match="type 9, which this mapping does not know"):
        rq_events("order-1", "charge", created_at=1.0, results=[result("2000-0", 9, "A", "e1", 1.5, 1.9)],
                  offset_ns=0)


def test_rq_history_of_a_real_pause_shows_the_takeover_and_the_late_success_rq_accepted(redis_client):
    """One real run: A frozen in the charge past its heartbeat; RQ's record gives B's claim while A
    was frozen, B's success, then A's late success, and final_states() from the same events."""
    need("rq")
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.targets import declared

    schedule = parse("A@charge.after_call:1*pause", points=frozenset(declared("rq:keyed").points))
    with Session() as session:
        r = session.run(RunConfig(schedule=schedule, target="rq:keyed"))
    assert (r.valid, r.unfired) == (True, ()), r.verdict
    results = {x.invariant: x for x in r.verdict.results}
    assert {name for name, x in results.items() if x.judged} == RQ_JUDGED
    events = list(r.history.events)
    charge = [e for e in events if e.process == "store" and e.get("step") == "charge"]
    assert [(e.kind, e.get("from_state"), e.get("to_state"), e.get("worker")) for e in charge] == [
        ("created", None, "pending", None), ("claimed", "pending", "running", "A"),
        ("claimed", "running", "running", "B"), ("committed", "running", "succeeded", "B"),
        ("committed", "running", "succeeded", "A")], [dict(e.data) for e in charge]
    stop = next(e.time for e in events if e.kind == "stop" and e.get("worker") == "A")
    cont = next(e.time for e in events if e.kind == "cont" and e.get("worker") == "A")
    assert stop < charge[2].time < charge[3].time < cont < charge[4].time  # B's while A was frozen
    assert r.exercise.tally().late_writes_accepted == 1
    assert {(f["instance"], f["step"]): f["state"] for f in r.history.final} == {
        ("order-1", "reserve"): "succeeded", ("order-1", "charge"): "succeeded"}


# -- Huey -------------------------------------------------------------------------------------------


def test_huey_naive_matrix_exits_1_on_the_duplicate_a_reaped_task_applies(redis_client):
    """Huey takes a task off its queue with no acknowledgement; the targets' reaper (what a Huey
    user must write for a task that must be done) enqueues a lost or frozen step again, and the
    naive task's new key applies the effect twice."""
    need("huey")
    code, out = matrix("huey:naive")
    assert_naive_caught(code, out, same_step=False)
    # killed after the effect and before Huey stored the result, or frozen past the lease
    assert {f"A@{step}.{point}" for step in ("reserve", "charge")
            for point in ("after_call:kill", "before_call:1*pause", "after_call:1*pause")} \
        <= {v["schedule"] for v in out["violations"]}
    assert_nothing_left(redis_client, out)


def test_huey_keyed_matrix_is_valid_with_every_declared_point_fired(redis_client):
    need("huey")
    code, out = matrix("huey:keyed")
    assert_keyed_valid_everywhere("huey:keyed", code, out)
    assert_nothing_left(redis_client, out)


def test_a_huey_task_lost_off_the_queue_is_enqueued_again_once_by_two_reapers(redis_client):
    """What the reaper protects: a task a worker took off Huey's queue and died with (no lease
    taken) is enqueued again once its grace has passed -- once, though two workers reap at once --
    and not while its grace or a lease holds."""
    need("huey")
    import time

    from killpoint.harness.libs import brokers, huey as target
    from killpoint.harness.libs.common import order_workload

    workload = order_workload(0)
    space = f"killpoint_test_reaper_{os.getpid()}"
    state = {"keyed": True, "backend": brokers.require_redis(), "space": space, "name": "killpoint",
             "steps": [(i.id, s.name) for i in workload.instances for s in i.steps]}
    try:
        assert target._enqueue(state, "order-1", "reserve")
        app, _ = target._huey(state)
        assert app.dequeue() is not None  # taken by a worker that died before Huey started it
        target.reap(state, workload)
        assert app.storage.queue_size() == 0  # its grace holds
        time.sleep(target.LEASE_S * 1.5)  # a lower bound: later is the same
        target.reap(state, workload)
        target.reap(state, workload)  # a second worker's reaper, which sees the same lost step
        assert app.storage.queue_size() == 1
        task = app.dequeue()
        assert tuple(task.args) == ("order-1", "reserve")
        # taken and started (its lease held): not reaped
        redis_client.set(target._lease_key(state, "order-1", "reserve"), "B", px=60_000)
        redis_client.delete(target._grace_key(state, "order-1", "reserve"))
        target.reap(state, workload)
        assert app.storage.queue_size() == 0
    finally:
        brokers.purge_redis(state["backend"], space)
