"""What killpoint says when a target that owns its state breaks its side of the contract, or
leaves a part of it unused: a ``history()`` with an unknown kind or a bad field is a named error
on the command line and in the JSON (never a false violation), judged on hand-written events and
on the worked PostgreSQL queue (examples/pg_queue) through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hang import HANG_S

from killpoint.harness.hooks import history_problem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_QUEUE = os.path.join(ROOT, "examples", "pg_queue")

GOOD = {"t": 5, "kind": "committed", "instance": "job-1", "step": "charge", "worker": "A",
        "from_state": "running", "to_state": "succeeded", "state_version": 2, "fence": 1, "attempt": 1}


@pytest.mark.parametrize("field, value, words", [
    ("state_version", "2", "state_version='2' (give a whole number)"),
    ("fence", 1.5, "fence=1.5"),
    ("instance", None, "instance=None"),
    ("t", "later", "t='later'"),
    ("to_state", "done", "to_state='done' (the states are pending"),
    ("worker", 7, "worker=7 (give a string)"),
])
def test_a_history_event_with_a_bad_field_is_named_by_its_field(field, value, words):
    assert history_problem(GOOD) is None
    assert words in (history_problem({**GOOD, field: value}) or "")


REQUEUE = textwrap.dedent('''
    """The worked queue worker (correct) with a history() that breaks the contract."""
    import killpoint
    import queue_worker as q


    def requeued(run):
        """A retried job's claim called 'requeued', a kind killpoint does not know."""
        return [{**e, "kind": "requeued"} if e["kind"] == "claimed" and (e.get("attempt") or 0) > 1 else e
                for e in q.history(run)]


    def text_versions(run):
        """Every state_version given as text."""
        return [{**e, "state_version": str(e["state_version"])} if "state_version" in e else e
                for e in q.history(run)]


    def _declare(history):
        t = killpoint.target(points=q.POINTS, owns_state=True, workload="queue_worker:jobs")(q.worker.fn)
        for hook in (q.setup, q.done, q.final_states, q.teardown):
            getattr(t, hook.__name__)(hook)
        t.history(history)
        return t


    requeue = _declare(requeued)
    text = _declare(text_versions)
''')


@pytest.fixture()
def broken_history(tmp_path, pg_dsn):
    (tmp_path / "broken_history.py").write_text(REQUEUE)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), PG_QUEUE]), "KILLPOINT_PG_DSN": pg_dsn}


def replay(env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "replay", "A@charge.after_call:kill", *args],
                          capture_output=True, text=True, env=env, timeout=HANG_S)


@pytest.mark.parametrize("target, words", [("requeue", "unknown kind 'requeued'"),
                                           ("text", "with state_version='")])
def test_a_history_of_an_unknown_kind_or_a_bad_field_is_a_named_error_not_a_violation(broken_history, target, words):
    """The correct queue worker, its retried claims left out of its history() by a kind killpoint
    does not know: once its stale-write and chain invariants judged the holes (violated); now they
    are not judged, the run is unknown (exit 3) and the cause is in the JSON and the closing output."""
    done = replay(broken_history, "--target", f"broken_history:{target}", "--json")
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["valid"] is None and out["violations"] == []
    errors = [e for e in out["target_errors"] if words in e["error"]]
    assert errors and all(e["runs"] == 1 and "history() hook" in e["error"] for e in errors)
    assert any(words in r for r in out["unknown_reasons"])
    assert any("not judged: the target's history() cannot be trusted" in r for r in out["unknown_reasons"])
    text = replay(broken_history, "--target", f"broken_history:{target}")
    assert text.returncode == 3 and words in text.stdout


STEPLESS = textwrap.dedent('''
    """A queue worker that serves for ever: it takes jobs from its own SQLite table, marking its
    before_claim outside any step (it does not know its job yet), as a SKIP LOCKED worker does."""
    import os
    import sqlite3

    import killpoint
    from killpoint import InstanceSpec, StepSpec, Workload


    def jobs(seed=0):
        return Workload("jobs", tuple(InstanceSpec(f"j{n}", (StepSpec("work", resource="payment",
                        params={"n": n}),)) for n in (1, 2)), {"payment": {"legacy": False}})


    def _db(run):
        return sqlite3.connect(os.path.join(run.run_dir, "queue.sqlite"), timeout=30, isolation_level=None)


    @killpoint.target(points=("before_claim", "before_call"), owns_state=True, workload="stepless:jobs")
    def worker(ctx):
        db = _db(ctx.run)
        while True:
            ctx.point("before_claim")
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT id FROM jobs WHERE state = 'pending' LIMIT 1").fetchone()
            if row is not None:
                db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", row)
            db.execute("COMMIT")
            if row is None:
                ctx.clock.sleep(0.005)
                continue
            job = row[0]
            with ctx.at(job, "work"):
                ctx.point("before_call")
                ctx.downstream.call("payment", key=f"{job}:work", params={"n": int(job[1:])},
                                    meta={"instance": job, "step": "work", "worker": ctx.worker_id})
            db.execute("UPDATE jobs SET state = 'succeeded' WHERE id = ?", (job,))


    @worker.setup
    def setup(run):
        db = _db(run)
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL)")
        db.executemany("INSERT INTO jobs VALUES (?, 'pending')", [(i.id,) for i in run.workload.instances])


    @worker.done
    def done(run):
        return _db(run).execute("SELECT count(*) FROM jobs WHERE state != 'succeeded'").fetchone()[0] == 0
''')


def test_a_fault_at_a_step_on_a_point_passed_outside_any_step_says_so_and_the_run_ends_without_its_bound(
        tmp_path, monkeypatch):
    """``A@work.before_claim:kill`` where the worker passes before_claim outside any step: it can
    never fire. The run used to wait out its 30 s bound, unknown with no hint; now it ends once the
    target's done() has said for a second that the work is finished, and the reason says why the
    fault never fired and how to schedule it."""
    from killpoint import RunConfig, Session, parse_schedule
    from killpoint import vocab

    (tmp_path / "stepless.py").write_text(STEPLESS)
    monkeypatch.syspath_prepend(str(tmp_path))
    schedule = parse_schedule("A@work.before_claim:kill", points=frozenset({"before_claim", "before_call"}))
    with Session() as session:
        result = session.run(RunConfig(schedule=schedule, target="stepless:worker"))
    assert result.valid is None
    (reason,) = [r for r in result.verdict.unknown_reasons if "never fired" in r]
    assert "passed before_claim" in reason and "outside any step" in reason and "A@before_claim:kill" in reason
    assert result.history.harness_events(vocab.UNFIRED_GIVEN_UP)
    assert not result.history.harness_events(vocab.BOUND_HIT)


LEASED = textwrap.dedent('''
    """A queue worker on its own SQLite table whose lease arithmetic reads the run clock: every time
    it stores or compares is ctx.clock.now(), and it waits through ctx.clock, so it may declare
    run_clock=True and run with production-like leases (30 s) on the virtual clock."""
    import os
    import sqlite3

    import killpoint
    from killpoint import InstanceSpec, StepSpec, Workload


    def jobs(seed=0):
        return Workload("jobs", tuple(InstanceSpec(f"j{n}", (StepSpec("work", resource="payment",
                        params={"n": n}),)) for n in (1, 2)), {"payment": {"legacy": False}})


    def _db(run):
        return sqlite3.connect(os.path.join(run.run_dir, "queue.sqlite"), timeout=30, isolation_level=None)


    def work(ctx, forever=False):
        db = _db(ctx.run)
        ttl = ctx.timing.lease_ttl_ms / 1000
        while True:
            now = ctx.clock.now()
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT id, fence FROM jobs WHERE state = 'pending' OR (state = 'running' "
                             "AND expires < ?) ORDER BY id LIMIT 1", (now,)).fetchone()
            if row is not None:
                db.execute("UPDATE jobs SET state = 'running', expires = ?, fence = fence + 1 WHERE id = ?",
                           (now + ttl, row[0]))
            db.execute("COMMIT")
            if row is None:
                left = db.execute("SELECT min(expires), count(*) FROM jobs WHERE state != 'succeeded'").fetchone()
                if left[1] == 0 and not forever:
                    return
                ctx.clock.wait_until(min(left[0] or now, now + ctx.timing.poll_ms / 1000) + 0.001)
                continue
            job, fence = row[0], row[1] + 1
            with ctx.at(job, "work"):
                ctx.point("before_call")
                ctx.downstream.call("payment", key=f"{job}:work", params={"n": int(job[1:])}, fence=fence,
                                    fence_scope=job, meta={"instance": job, "step": "work", "worker": ctx.worker_id})
                ctx.point("after_call")
            db.execute("UPDATE jobs SET state = 'succeeded' WHERE id = ? AND fence = ?", (job, fence))


    def setup(run):
        db = _db(run)
        db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL DEFAULT 'pending', "
                   "expires REAL, fence INTEGER NOT NULL DEFAULT 0)")
        db.executemany("INSERT INTO jobs (id) VALUES (?)", [(i.id,) for i in run.workload.instances])


    def done(run):
        return _db(run).execute("SELECT count(*) FROM jobs WHERE state != 'succeeded'").fetchone()[0] == 0


    on_clock = killpoint.target(points=("before_call", "after_call"), owns_state=True, workload="leased:jobs",
                                run_clock=True, setup=setup, done=done)(work)
    serving = killpoint.target(points=("before_call", "after_call"), owns_state=True, workload="leased:jobs",
                               run_clock=True, setup=setup, done=done)(lambda ctx: work(ctx, forever=True))
    off_clock = killpoint.target(points=("before_call", "after_call"), owns_state=True, workload="leased:jobs",
                                 setup=setup, done=done)(work)
''')


@pytest.fixture()
def leased(tmp_path, monkeypatch):
    (tmp_path / "leased.py").write_text(LEASED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_an_owned_state_target_reading_ctx_clock_runs_on_the_run_clock_and_its_lease_lapses_in_run_time(leased):
    """run_clock=True: the 30 s lease of a worker frozen at its call lapses on the virtual clock,
    another worker takes the job over (the pause is exercised) and the run's own time passes the
    lease; the same target without the declaration runs in real time, with the short timings."""
    from killpoint import RunConfig, Session, Timing, parse_schedule
    from killpoint.harness.worker import REAL_TIME_TIMING

    schedule = parse_schedule("A@work.before_call:1*pause", points=frozenset({"before_call", "after_call"}))
    config = RunConfig(schedule=schedule, target="leased:on_clock")
    assert (config.virtual_time, config.timing) == (True, Timing())
    off = RunConfig(schedule=schedule, target="leased:off_clock")
    assert (off.virtual_time, off.timing) == (False, REAL_TIME_TIMING)
    assert "--real-time" in off.reproduce_command() and "--real-time" not in config.reproduce_command()
    with Session() as session:
        result = session.run(config)
    assert result.valid is True, result.verdict.unknown_reasons
    assert result.exercise is not None
    (p,) = result.exercise.faults
    assert p.takeover_by is not None and p.takeover_by != "A"
    times = [e.time for e in result.history.events]
    assert max(times) - min(times) > Timing().lease_ttl_ms * 1e6  # the lease lapsed in run time


def test_no_real_time_for_a_target_off_the_run_clock_is_a_warning_not_silence(leased):
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "replay", "A@work.after_call:kill",
                           "--target", "leased:off_clock", "--no-real-time"],
                          capture_output=True, text=True, cwd=leased, timeout=HANG_S)
    assert "killpoint: warning: --no-real-time: leased:off_clock keeps its state" in done.stderr, done.stderr
    assert "run_clock=True" in done.stderr and "--real-time" in done.stdout  # its reproduce line says so
    on = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "replay", "A@work.after_call:kill",
                         "--target", "leased:on_clock", "--no-real-time"],
                        capture_output=True, text=True, cwd=leased, timeout=HANG_S)
    assert "warning" not in on.stderr and on.returncode == 0, on.stdout + on.stderr


def test_an_owned_state_run_with_a_hung_worker_ends_once_done_says_the_work_is_finished(leased):
    """A worker hung at its call (its lease lapses on the run clock, another takes the job over)
    while the others serve for ever: once done() says the work is finished the run ends, the hung
    worker with them, instead of lasting its whole bound; the hang is counted as exercised."""
    from killpoint import RunConfig, Session, parse_schedule
    from killpoint import vocab

    schedule = parse_schedule("A@work.before_call:1*hang", points=frozenset({"before_call", "after_call"}))
    with Session() as session:
        result = session.run(RunConfig(schedule=schedule, target="leased:serving"))
    assert result.valid is True, result.verdict.unknown_reasons
    assert not result.history.harness_events(vocab.BOUND_HIT)
    assert any("done() says" in (e.get("reason") or "") for e in result.history.harness_events(vocab.KILL))
    assert result.exercise is not None and result.exercise.tally().hangs_exercised == 1
