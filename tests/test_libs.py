"""The targets shipped for real durable-execution libraries (killpoint.harness.libs): DBOS, LangGraph
and procrastinate, each run as that library's own workflow, graph or job.

For each library the naive target (a new idempotency key per attempt) must be caught by its crash
matrix -- exit 1, ``no_duplicate_effects`` -- and the keyed target (a key stable across attempts)
must be valid on the whole matrix with every declared point fired. Through the CLI, as CI runs it.

A library that is not installed skips its tests; with ``KILLPOINT_REQUIRE_LIBS=1`` (CI sets it, and
installs the extras) they fail instead, so CI can never go green by skipping.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

import pytest

from killpoint.harness.libs.common import PauseGuard
from hang import HANG_S

if TYPE_CHECKING:
    from killpoint.harness.history import History


def need(library: str) -> None:
    if importlib.util.find_spec(library) is None:
        if os.environ.get("KILLPOINT_REQUIRE_LIBS") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_LIBS=1 but {library} is not installed "
                        f"(pip install 'killpoint[{library}]')", pytrace=False)
        pytest.skip(f"{library} is not installed: pip install 'killpoint[{library}]'")


def matrix(target: str, *extra: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "matrix", "--target", target, "--json",
                           *extra], capture_output=True, text=True, timeout=HANG_S, env={**os.environ, **(env or {})})
    assert done.stdout, done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def declared_points(target: str) -> set[str]:
    from killpoint.harness.targets import declared

    return set(declared(target).points)


def fired_points(out: dict) -> set[str]:
    return {fault.split(":")[0].split("#")[0].split("@")[1].split(".")[-1]
            for r in out["results"] for fault, n in r["fired"].items() if n}


def assert_keyed_valid_everywhere(target: str, code: int, out: dict) -> None:
    assert (code, out["valid"], out["unknown"]) == (0, True, []), (out["unknown"], out["violations"])
    assert all(not r["unfired"] for r in out["results"])
    assert fired_points(out) == declared_points(target)  # every declared point fired, no other scheduled
    assert out["invariants"]["no_duplicate_effects"]["checked"] == out["runs"]


def assert_keyed_valid_where_exercised(target: str, code: int, out: dict) -> None:
    """As :func:`assert_keyed_valid_everywhere`, for a library whose other workers may never take a
    frozen worker's work over (DBOS recovers only a dead executor's workflows; LangGraph's other
    workers give up on a held lease): every run is valid but those whose pause provoked no takeover,
    which are unknown for that alone, said as not exercised, never counted valid."""
    if code == 0:
        assert_keyed_valid_everywhere(target, code, out)
        return
    assert (code, out["valid"], out["violations"]) == (3, None, []), out["unknown"]
    assert out["unknown"] and all(all("not exercised" in why for why in u["reasons"]) and ":1*pause" in u["schedule"]
                                  for u in out["unknown"]), out["unknown"]
    assert out["exercise"]["pauses_exercised"] < out["exercise"]["pauses"]
    assert all(r["valid"] is True for r in out["results"] if ":1*pause" not in r["schedule"])
    assert all(not r["unfired"] for r in out["results"])
    assert fired_points(out) == declared_points(target)


def assert_naive_caught(code: int, out: dict, *, same_step: bool = True) -> None:
    assert (code, out["valid"]) == (1, False), out["unknown"]
    assert {v["invariant"] for v in out["violations"]} == {"no_duplicate_effects"}
    if same_step:  # the duplicate is the step the crash hit after its call, re-run by recovery
        assert all(v["schedule"].split(".")[0].split("@")[1] == v["step"] for v in out["violations"])


# -- DBOS -------------------------------------------------------------------------------------------


def test_dbos_naive_matrix_exits_1_on_the_duplicate_a_rerun_step_applies():
    need("dbos")
    code, out = matrix("dbos:naive")
    assert_naive_caught(code, out)
    # DBOS re-runs a step killed before its output was recorded, never one whose output was; a
    # worker frozen before its call that comes back after another worker recovered the workflow
    # (started once its lease would have lapsed) may make its stale call too
    def point(v):
        return v["schedule"].split(":")[0].split("#")[0].split(".")[-1]

    kills = {point(v) for v in out["violations"] if "pause" not in v["schedule"]}
    assert kills == {"after_call"}
    assert {point(v) for v in out["violations"]} <= {"after_call", "before_call"}
    # DBOS's operation outputs (history()) and workflow statuses (final_states()) let more judge
    for name in ("version_chain", "legal_transitions", "effects_accounted", "terminates"):
        assert out["invariants"][name]["checked"] == out["runs"], name


def test_dbos_keyed_matrix_is_valid_where_its_faults_were_exercised_with_every_declared_point_fired():
    need("dbos")
    code, out = matrix("dbos:keyed")
    assert_keyed_valid_where_exercised("dbos:keyed", code, out)


def test_dbos_a_replacement_of_a_replacement_recovers_under_the_dead_executors_id():
    """Recovery through DBOS's public path: each fresh worker that replaces a dead one launches with the
    executor id the dead one ran under (C under A's, D under C's, which is A's), and launch recovery
    finishes the workflow; with both kills fired the keyed target stays valid, and history() names the
    worker that ran each step, not the executor id they shared."""
    need("dbos")
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.targets import declared

    schedule = parse("A@charge.before_call:kill,C@charge.after_call:kill",
                     points=frozenset(declared("dbos:keyed").points))
    with Session() as session:
        r = session.run(RunConfig(schedule=schedule, target="dbos:keyed", same_identity=0.0))
    assert (r.valid, r.verdict.unknown_reasons, r.unfired) == (True, (), ()), r.verdict
    assert r.fired == {"A@charge.before_call:kill": 1, "C@charge.after_call:kill": 1}
    ran = {(e.data["step"], e.kind): (e.data["worker"], e.data["executor"]) for e in r.history.store_events()}
    assert ran == {("reserve", "claimed"): ("A", "A"), ("reserve", "committed"): ("A", "A"),
                   ("charge", "claimed"): ("D", "A"), ("charge", "committed"): ("D", "A")}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_dbos_leaves_no_template_folder_behind_with_any_number_of_jobs(tmp_path, jobs):
    """Protects: the migrated DBOS database each harness process makes once (a folder in TMPDIR) is
    removed when that process ends -- also a --jobs runner, which ends with os._exit and runs no
    atexit hook (every --jobs 2 matrix left two folders)."""
    need("dbos")
    code, out = matrix("dbos:keyed", "--points", "before_call,after_call", "--steps", "charge",
                       "--actions", "kill", "--jobs", jobs, env={"TMPDIR": str(tmp_path)})
    assert (code, out["valid"], out["runs"]) == (0, True, 2), out["unknown"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("killpoint-dbos-")] == []


# -- LangGraph --------------------------------------------------------------------------------------


def test_langgraph_naive_matrix_exits_1_on_the_duplicate_a_resumed_node_applies():
    need("langgraph")
    code, out = matrix("langgraph:naive")
    # under LangGraph's default durability (async) a finished node's checkpoint may not be written
    # yet when the next node is crashed, so the duplicate may be the earlier step's
    assert_naive_caught(code, out, same_step=False)
    assert {"A@reserve.after_call:kill", "A@charge.after_call:kill"} <= {v["schedule"] for v in out["violations"]}


def test_langgraph_keyed_matrix_is_valid_where_its_faults_were_exercised_with_every_declared_point_fired():
    need("langgraph")
    code, out = matrix("langgraph:keyed")
    assert_keyed_valid_where_exercised("langgraph:keyed", code, out)


def test_langgraph_exit_durability_reruns_a_finished_node_that_sync_durability_keeps():
    """A kill as the second node starts: with ``sync`` the first node's checkpoint is written and
    resuming the thread skips it; with ``exit`` nothing was written and the first node runs again."""
    need("langgraph")
    schedule = ["--points", "before_call", "--actions", "kill", "--steps", "charge"]
    code, out = matrix("langgraph:naive:sync", *schedule)
    assert (code, out["valid"], out["runs"]) == (0, True, 1), out
    code, out = matrix("langgraph:naive:exit", *schedule)
    assert (code, out["valid"]) == (1, False)
    assert [(v["invariant"], v["step"]) for v in out["violations"]] == [("no_duplicate_effects", "reserve")]


# -- procrastinate ----------------------------------------------------------------------------------


def test_procrastinate_naive_matrix_exits_1_on_the_duplicate_a_retried_stalled_job_applies(pg_dsn):
    need("procrastinate")
    code, out = matrix("procrastinate:naive", env={"KILLPOINT_PG_DSN": pg_dsn})
    # a retried job runs from its start: a crash in the charge also applies the reserve again
    assert_naive_caught(code, out, same_step=False)
    assert ("A@charge.after_call:kill", "reserve") in {(v["schedule"], v["step"]) for v in out["violations"]}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_procrastinate_without_postgresql_is_one_line_of_bad_input_not_a_matrix_of_unknowns(jobs):
    # Its setup() refuses a SQLite store: that is said once, naming the store, with exit 2 (it was
    # every run unknown, the same reason repeated, exit 3), and nothing is left running.
    need("procrastinate")
    env = {k: v for k, v in os.environ.items() if k != "KILLPOINT_PG_DSN"}
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "matrix", "--target",
                           "procrastinate:keyed", "--jobs", jobs, "-q"],
                          capture_output=True, text=True, timeout=HANG_S, env=env)
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("killpoint: error: procrastinate needs PostgreSQL"), lines
    assert "--store sqlite" in lines[0]


def test_procrastinate_keyed_matrix_is_valid_with_every_declared_point_fired(pg_dsn):
    need("procrastinate")
    code, out = matrix("procrastinate:keyed", env={"KILLPOINT_PG_DSN": pg_dsn})
    assert_keyed_valid_everywhere("procrastinate:keyed", code, out)


def test_procrastinate_history_lets_the_chain_invariants_judge_its_job_events(pg_dsn):
    """procrastinate's own job events (history()) judged: more invariants than the ledger's, and the
    duplicate still the only violation of the naive target."""
    need("procrastinate")
    code, out = matrix("procrastinate:naive", "--points", "after_call", "--steps", "charge", "--actions", "kill",
                       env={"KILLPOINT_PG_DSN": pg_dsn})
    assert_naive_caught(code, out, same_step=False)
    judged = {name for name, n in out["invariants"].items() if n["checked"]}
    # without history() only no_duplicate_effects, effects_accounted and terminates judged (3 of 15;
    # effects_match_intent needs an intent() hook from a target that owns its state); procrastinate
    # records no fence, so stale_writes_rejected has nothing to compare
    assert judged == {"no_duplicate_effects", "effects_accounted", "terminates", "version_chain",
                      "legal_transitions"}, judged
    assert out["judged"] == 5 and out["runs"] == 1


def _procrastinate_schemas(pg_dsn: str) -> set[str]:
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s",
                                           ("kp\\_procrastinate\\_%",))}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_procrastinate_leaves_no_schema_behind_with_any_number_of_jobs(pg_dsn, jobs):
    """Protects: the schema with procrastinate's tables, made once per harness process, is dropped
    when that process ends -- also a --jobs runner, which ends with os._exit and runs no atexit
    hook (two schemas were left in the user's database by every matrix with --jobs 2)."""
    need("procrastinate")
    before = _procrastinate_schemas(pg_dsn)
    code, out = matrix("procrastinate:keyed", "--points", "before_call,after_call", "--steps", "charge",
                       "--actions", "kill", "--jobs", jobs, env={"KILLPOINT_PG_DSN": pg_dsn})
    assert (code, out["valid"], out["runs"]) == (0, True, 2), (out["violations"], out["unknown"])
    assert _procrastinate_schemas(pg_dsn) - before == set()


def test_procrastinate_refused_stale_finish_is_journalled_not_printed(pg_dsn):
    """Protects: the frozen worker, resumed after its job was retried and finished by another, has
    its finish refused by procrastinate (an error procrastinate leaves in a task nobody awaits);
    the worker journals it as ``library_error`` instead of printing asyncio's traceback over the
    user's terminal, and the verdict is the duplicate as before."""
    need("procrastinate")
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "replay", "A@reserve.before_call:1*pause",
                           "--target", "procrastinate:naive", "--json"], capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, "KILLPOINT_PG_DSN": pg_dsn})
    out = json.loads(done.stdout)
    assert (done.returncode, out["valid"]) == (1, False), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "never retrieved" not in done.stderr, done.stderr[-3000:]
    from killpoint.chaos.schedule import parse
    from killpoint.harness.run import RunConfig, Session
    from killpoint.harness.targets import declared

    with Session() as session:
        result = session.run(RunConfig(schedule=parse("A@reserve.before_call:1*pause",
                                                      points=frozenset(declared("procrastinate:naive").points)),
                                       target="procrastinate:naive", store=pg_dsn))
    errors = [e for e in result.history.events if e.kind == "library_error"]
    assert [e.process for e in errors] == ["A"], [(e.process, e.kind) for e in result.history.events]
    assert "not in \"doing\" or \"todo\" status" in errors[0].get("error")


def _job_history(*rows: tuple) -> "History":
    from killpoint.harness.history import merge
    from killpoint.harness.libs.procrastinate import job_events

    events = job_events(rows, {"order-1": ["reserve", "charge"]}, now=10**15)
    return merge({}, events, [], [], owns_state=True)


def test_procrastinate_job_events_map_a_stalled_retry_to_one_legal_chain_per_step():
    """A job deferred, started, retried as stalled, started again and succeeded: one chain per step,
    each transition legal, state_version +1 each, the n-th start attempt n."""
    need("procrastinate")
    from killpoint.harness.checkers import check_all

    h = _job_history((1, 7, "deferred", 1000.0, "order-1", "succeeded"),
                     (2, 7, "started", 1001.0, "order-1", "succeeded"),
                     (3, 7, "deferred_for_retry", 1002.0, "order-1", "succeeded"),
                     (4, 7, "abort_requested", 1002.5, "order-1", "succeeded"),  # no status change
                     (5, 7, "started", 1003.0, "order-1", "succeeded"),
                     (6, 7, "succeeded", 1003.0, "order-1", "succeeded"))  # same now(): order kept
    chain = [(e.kind, e.data["from_state"] if "from_state" in e.data else None, e.data["to_state"],
              e.data["state_version"], e.data.get("attempt")) for e in h.store_events("order-1", "charge")]
    assert chain == [("created", None, "pending", 1, None), ("claimed", "pending", "running", 2, 1),
                     ("committed", "running", "retry_scheduled", 3, None),
                     ("claimed", "retry_scheduled", "running", 4, 2), ("committed", "running", "succeeded", 5, None)]
    assert len(h.store_events("order-1", "reserve")) == 5
    results = {r.invariant: r for r in check_all(h).results}
    for name in ("version_chain", "legal_transitions"):
        assert (results[name].valid, results[name].judged) == (True, True), results[name]


@pytest.mark.parametrize("rows, refused", [
    # a finished job run again (what recovery must never do)
    ([(2, 7, "started", 1001.0, "order-1", "succeeded"), (3, 7, "succeeded", 1002.0, "order-1", "succeeded"),
      (4, 7, "started", 1003.0, "order-1", "succeeded")], "succeeded -> running"),
    # a failed job retried by hand: procrastinate allows it, killpoint takes failed as final
    ([(2, 7, "started", 1001.0, "order-1", "todo"), (3, 7, "failed", 1002.0, "order-1", "todo"),
      (4, 7, "retried", 1003.0, "order-1", "todo")], "failed -> retry_scheduled"),
    # a todo job finished as succeeded without running (procrastinate's trigger calls it "cancelled")
    ([(2, 7, "cancelled", 1001.0, "order-1", "succeeded")], "pending -> succeeded"),
    # a stale finish: the job retried under a live worker whose heartbeat was late by the stalled
    # bound, then finished by that worker before anyone started it again (procrastinate takes it)
    ([(2, 7, "started", 1001.0, "order-1", "succeeded"), (3, 7, "deferred_for_retry", 1002.0, "order-1", "succeeded"),
      (4, 7, "cancelled", 1003.0, "order-1", "succeeded")], "retry_scheduled -> succeeded"),
])
def test_procrastinate_job_paths_the_transition_table_refuses_break_legal_transitions(rows, refused):
    """legal_transitions judges procrastinate's recorded status path, not the event names' promises."""
    need("procrastinate")
    from killpoint.harness.checkers import legal_transitions

    h = _job_history((1, 7, "deferred", 1000.0, "order-1", rows[-1][5]), *rows)
    result = legal_transitions(h)
    assert result.valid is False
    assert {(v.step, refused in v.detail) for v in result.violations} == {("reserve", True), ("charge", True)}


# -- names, extras and the pause guard --------------------------------------------------------------


def test_a_library_target_without_its_extra_names_the_extra_to_install():
    code = ("import sys; sys.modules['dbos'] = None\n"
            "from killpoint.harness.targets import resolve\n"
            "try:\n    resolve('dbos:naive')\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert done.stdout.startswith("InvalidTarget "), done.stderr[-2000:]
    assert "pip install 'killpoint[dbos]'" in done.stdout


def test_an_unknown_library_variant_is_refused_with_the_known_names():
    need("dbos")
    from killpoint.errors import InvalidTarget
    from killpoint.harness.targets import resolve

    with pytest.raises(InvalidTarget, match="dbos:naive, dbos:keyed"):
        resolve("dbos:nonsense")


def test_loading_the_targets_module_imports_no_library():
    code = ("import sys, killpoint.harness.targets, killpoint.harness.libs\n"
            "print(sorted(m for m in ('dbos', 'langgraph', 'procrastinate') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]


def test_a_pause_waits_for_other_threads_connections_and_holds_new_ones_back():
    guard = PauseGuard()
    inside, may_leave, paused, again, entered_again = (threading.Event() for _ in range(5))

    def library_thread() -> None:
        guard.enter()  # a connection out, as a library's thread inside a transaction
        inside.set()
        may_leave.wait(10)
        guard.leave()
        again.wait(10)
        guard.enter()  # the next connection: must wait while the pause holds the guard
        entered_again.set()
        guard.leave()

    def pausing_thread() -> None:
        guard.enter()  # its own connection does not make its pause wait for itself
        guard.acquire()
        paused.set()

    t = threading.Thread(target=library_thread)
    t.start()
    assert inside.wait(10)
    p = threading.Thread(target=pausing_thread)
    p.start()
    assert not paused.wait(0.2)  # the other thread still holds a connection
    may_leave.set()
    assert paused.wait(10)
    again.set()
    assert not entered_again.wait(0.2)  # no new connection while paused
    guard.release()
    assert entered_again.wait(10)
    t.join(10)
    p.join(10)
