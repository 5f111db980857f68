"""Real connection faults on PostgreSQL (issue 7, item 3): ``terminate`` ends a worker's backends.

The store must tell a transaction that certainly rolled back (:class:`StoreUnavailable`) from one
whose COMMIT was sent before the connection died (:class:`OutcomeUnknown`), drop the dead connection
and reconnect; the reference worker must journal the lost operation as ``fail`` or ``info``, leave
the step to recovery and go on; the harness must end only the run's own sessions, and at
``in_db_commit`` only once the COMMIT was processed, so the unknown outcome is a real commit.
Everything here but the refusals on SQLite needs a server (``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from typing import Any, Iterator

import pytest

from killpoint import chaos
from killpoint.chaos.journal import Journal
from killpoint.chaos.points import DB_POINTS, DEFAULT_POINTS, Failpoints
from killpoint.harness import states
from killpoint.harness.cli import main
from killpoint.harness.run import RunConfig, Session
from killpoint.harness.store import OutcomeUnknown, StoreUnavailable, schema_name
from killpoint.harness.store.postgres import PostgresStore, connect

INSTANCES = [{"id": "order-1", "format_version": 1, "fingerprint": "fp", "data": "{}", "integrity": "ih",
              "steps": ["charge"]}]


# -- the store on its own -----------------------------------------------------------------------
@pytest.fixture
def pg_store(pg_dsn) -> Iterator[PostgresStore]:
    store = PostgresStore(pg_dsn, schema_name("faults"))
    store.setup(INSTANCES)
    yield store
    store.drop()


def _row(store: PostgresStore) -> dict[str, Any]:
    [row] = store.steps()
    return row


def _claim(store: PostgresStore):
    r = _row(store)
    claim = store.claim("order-1", "charge", "A", expected_state_version=r["state_version"],
                        from_state=r["state"], to_state=states.RUNNING, ttl_ms=60_000.0)
    assert claim is not None
    return claim


@contextlib.contextmanager
def _harness_in_a_thread(store: PostgresStore, schedule: str, tmp_path) -> Iterator[list[dict[str, Any]]]:
    """This process's failpoints, with a thread playing the harness's part of ``terminate``."""
    events_r, events_w = os.pipe()
    control_r, control_w = os.pipe()
    admin = PostgresStore(store.dsn, store.schema)  # the harness's own handle
    ended: list[dict[str, Any]] = []

    def harness() -> None:
        buf = b""
        while chunk := os.read(events_r, 65536):
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                msg = json.loads(line)
                if "terminate" in msg:
                    ended.append(admin.terminate_backends(msg["backend_pids"], await_idle=msg["await_idle"]))
                    os.write(control_w, b"r")

    thread = threading.Thread(target=harness, daemon=True)
    thread.start()
    chaos.points.install(Failpoints(list(chaos.parse(schedule).for_worker("A")),
                                    Journal(tmp_path / "journal.jsonl"), 0, events_w, control_r,
                                    backends=store.backends))
    try:
        yield ended
    finally:
        chaos.points.install(None)
        os.close(events_w)
        thread.join(10)
        for fd in (events_r, control_r, control_w):
            os.close(fd)


@pytest.mark.parametrize("point, exc, state_seen, committed", [
    ("before_db_commit", StoreUnavailable, "idle in transaction", False),
    ("in_db_commit", OutcomeUnknown, "idle", True),
])
def test_a_commit_whose_backend_is_terminated_says_what_became_of_it_and_the_next_call_reconnects(
        pg_store, tmp_path, point, exc, state_seen, committed):
    """Protects: before COMMIT is sent a lost connection means rolled back (StoreUnavailable, and
    the row is unchanged); after, the transaction really committed on the server (the harness
    waited for ``idle``) while the caller is told only that the outcome is unknown; either way
    the dead connection is dropped and the next call works on a new session."""
    claim = _claim(pg_store)
    old_pid = pg_store.conn().info.backend_pid
    with _harness_in_a_thread(pg_store, f"A@{point}:1*terminate", tmp_path) as ended:
        with pytest.raises(StoreUnavailable) as err:
            pg_store.commit(claim, states.SUCCEEDED)
    assert type(err.value) is exc
    assert ended == [{"backend_pids": [old_pid], "states": {str(old_pid): state_seen}}]
    row = _row(pg_store)  # a new connection
    assert pg_store.conn().info.backend_pid != old_pid
    assert row["state"] == (states.SUCCEEDED if committed else states.RUNNING)
    assert [e["kind"] for e in pg_store.events()].count("committed") == int(committed)


def test_the_next_call_after_a_terminated_idle_session_fails_cleanly_then_reconnects(pg_store):
    """Protects: a backend ended between transactions (a protocol point) makes the next call
    raise plain StoreUnavailable -- its COMMIT was never sent -- and the one after that works."""
    pid = pg_store.conn().info.backend_pid
    assert pg_store.terminate_backends([pid])["backend_pids"] == [pid]
    with pytest.raises(StoreUnavailable) as err:
        _claim(pg_store)
    assert type(err.value) is StoreUnavailable
    assert _row(pg_store)["lease_version"] == 0  # that claim never happened
    assert _claim(pg_store).fence == 1


def test_a_client_side_error_without_sqlstate_is_a_lost_connection_not_a_crash(pg_store):
    """Protects: psycopg's wait loop raises ``OperationalError("connection socket closed")`` when
    the socket hangs up before libpq has read the server's last words (its status still OK). A
    terminated worker met it in CI and crashed with it, which made an eight-worker race run
    unknown. It is a lost connection: StoreUnavailable, the connection dropped, the next call
    reconnects. A server error (with a SQLSTATE) on a live connection is still passed through."""
    import psycopg

    first = pg_store.conn()

    def hang_up(cur: Any) -> None:
        cur.execute("SELECT 1")
        raise psycopg.OperationalError("connection socket closed")

    with pytest.raises(StoreUnavailable):
        pg_store._write(hang_up)
    assert first.closed and pg_store.conn() is not first
    assert _claim(pg_store).fence == 1  # the next call works on a new connection

    def refused(cur: Any) -> None:
        cur.execute("SELECT 1 / 0")

    with pytest.raises(psycopg.errors.DivisionByZero):
        pg_store._write(refused)
    assert not pg_store.conn().closed


def _stalled_reads(store: PostgresStore, stall_s: float) -> list[str]:
    """Two reads that stall mid-transaction (a long GC, a starved CPU): after their last statement,
    and between two statements. What became of each: ``ok`` or the exception's class name."""
    def after_last(cur: Any) -> None:
        cur.execute("SELECT 1")
        time.sleep(stall_s)

    def between(cur: Any) -> None:
        cur.execute("SELECT 1")
        time.sleep(stall_s)
        cur.execute("SELECT 2")

    outcomes = []
    for fn in (after_last, between):
        try:
            store._read(fn)
            outcomes.append("ok")
        except Exception as exc:
            outcomes.append(type(exc).__name__)
    return outcomes


def test_a_stall_past_the_idle_timeout_ends_a_workers_session_never_the_harnesss(pg_dsn):
    """Protects: the run's verdicts from a false infrastructure failure. A worker's sessions end
    after ``idle_tx_timeout_ms`` idle in a transaction (a frozen worker must not hold its locks),
    and that is a lost connection (StoreUnavailable, never the driver's own exception, which
    would read as the target raising); the harness's session -- the process that made the handle,
    never frozen -- outlives a stall of its own (it used to be ended, and the run with it)."""
    store = PostgresStore(pg_dsn, schema_name("stall"), idle_tx_timeout_ms=100)
    store.setup(INSTANCES)
    pid = 0
    try:
        assert _stalled_reads(store, 0.5) == ["ok", "ok"]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a worker: its own handle's sessions and its heartbeat handle's
            try:
                os.close(r)
                os.write(w, json.dumps(_stalled_reads(store, 0.5) + _stalled_reads(store.clone(), 0.5)).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as fh:
            seen = json.loads(fh.read() or b"null")
        os.waitpid(pid, 0)
        pid = 0
        assert seen == ["StoreUnavailable"] * 4
        assert _stalled_reads(store, 0.0) == ["ok", "ok"]  # and the harness's handle still works
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        store.drop()


def test_terminate_backends_ends_only_sessions_of_its_own_run(pg_store, pg_dsn):
    """Protects: whatever PIDs a worker reports, the harness never ends a session that is not
    this run's (another run's, or anybody else's on a shared server)."""
    with connect(pg_dsn, autocommit=True) as bystander:
        pid = bystander.info.backend_pid
        assert pg_store.terminate_backends([pid])["backend_pids"] == []
        assert bystander.execute("SELECT 1").fetchone() == (1,)


# -- end to end on the reference worker -----------------------------------------------------------
@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    with Session() as s:
        yield s


def _terminated(result) -> tuple[Any, list[Any]]:
    """The harness's terminate_backend event, and worker A's journal entries after it."""
    [event] = [e for e in result.history.of("harness", "terminate_backend")]
    after = [e for e in result.history.events if e.index > event.index and e.process == event.get("worker")]
    return event, after


def _assert_terminated_and_met(result, point: str) -> Any:
    assert result.valid is True, ([v.detail for v in result.verdict.violations],
                                  result.verdict.unknown_reasons)
    assert result.unfired == () and all(n == 1 for n in result.fired.values())
    event, after = _terminated(result)
    assert event.get("point") == point and event.get("worker") == "A"
    assert event.get("backend_pids"), "no session of the worker was ended"
    # The worker met the dead connection on its next store call, and carried on.
    assert any(e.kind == "store_unavailable" for e in after), [(e.kind, e.type) for e in after]
    return event


@pytest.mark.parametrize("point", DEFAULT_POINTS)
def test_terminate_at_every_protocol_point_is_survived_and_judged_valid(session, pg_dsn, point):
    """Protects: a worker whose sessions are ended at any point of the protocol neither crashes
    nor corrupts anything: its next store call fails, the step goes to recovery, the verdict is
    valid with the fault fired."""
    result = session.run(RunConfig(schedule=chaos.parse(f"A@charge.{point}:1*terminate"), store=pg_dsn))
    event = _assert_terminated_and_met(result, point)
    spawned = [e for e in result.history.of("harness", "spawn") if e.get("identity") == "A"]
    assert len(spawned) == 1, "the worker crashed and was replaced instead of carrying on"
    assert event.get("step") == "charge"


def _op_after(after: list[Any]) -> Any:
    """The completion of the operation the terminate caught: the first op completion after it."""
    return next(e for e in after if e.kind in ("claim", "receipt", "commit") and e.type != "invoke")


@pytest.mark.parametrize("hit, kind", [(1, "claim"), (2, "receipt"), (3, "commit")])
def test_terminate_in_db_commit_commits_unknown_to_the_worker_and_recovery_settles_it(
        session, pg_dsn, hit, kind):
    """Protects: the case the issue names -- COMMIT sent, backend ended before the answer
    arrived. The worker journals the operation as ``info``; the store shows the transaction
    committed from the dead connection; the step still ends succeeded with one effect."""
    result = session.run(RunConfig(schedule=chaos.parse(f"A@charge.in_db_commit#{hit}:1*terminate"),
                                   store=pg_dsn))
    event = _assert_terminated_and_met(result, "in_db_commit")
    worker_pid = event.get("backend_pids")[0]  # the worker's own session; the heartbeat's may follow
    assert event.get("states")[str(worker_pid)] == "idle"  # COMMIT processed before the end
    instance, step = event.get("instance"), event.get("step")
    op = _op_after(_terminated(result)[1])
    assert (op.kind, op.type) == (kind, "info") and "lost" in op.get("error")
    # The transaction committed all the same: its store event is there, from worker A.
    store_kind = {"claim": "claimed", "receipt": "receipt_recorded", "commit": "committed"}[kind]
    assert [e for e in result.history.of("store", store_kind)
            if (e.get("instance"), e.get("step"), e.get("worker")) == (instance, step, "A")
            and e.time < event.time]
    assert result.history.final_state(instance, step) == states.SUCCEEDED
    key = next(s.key for s in result.history.steps if (s.instance, s.step) == (instance, step))
    applied = [e for e in result.history.of("downstream", "request")
               if e.get("key") == key and e.get("applied")]
    assert len(applied) == 1
    if kind == "claim":  # the claim A never learned of was taken over after its lease expired
        assert [e for e in result.history.events if e.kind == "recover" and e.get("step") == step
                and e.get("instance") == instance]


def test_a_worker_terminated_at_every_commit_does_not_hold_the_run_clock(session, pg_dsn):
    """Protects: a worker whose every transaction is lost (an uncounted ``terminate``) waits
    through the run's clock between attempts, so the clock still jumps: the 30 s lease of a worker
    killed after its claim expires and is taken over in less wall time than the lease (the failing
    worker used to spin and hold the clock still until the run hit its bound)."""
    result = session.run(RunConfig(schedule=chaos.parse("A@in_db_commit:terminate,B@charge.after_claim:kill"),
                                   workers=3, store=pg_dsn))
    assert result.config.virtual_time and result.config.timing.lease_ttl_ms == 30_000
    assert result.valid is True, ([v.detail for v in result.verdict.violations],
                                  result.verdict.unknown_reasons)
    assert result.fired["A@in_db_commit:terminate"] >= 2
    assert len([e for e in result.history.of_workers("store_unavailable") if e.process == "A"]) >= 2
    killed = next(e for e in result.history.of("store", "claimed")
                  if e.get("worker") == "B" and e.get("step") == "charge")
    assert [e for e in result.history.of("store", "claimed") if e.get("step") == "charge"
            and e.get("instance") == killed.get("instance") and e.get("fence") > killed.get("fence")]
    assert result.duration_s < result.config.timing.lease_ttl_ms / 1000.0


@pytest.mark.parametrize("hit, kind", [(1, "claim"), (2, "receipt"), (3, "commit")])
def test_terminate_before_db_commit_rolls_back_and_the_worker_knows_it(session, pg_dsn, hit, kind):
    """Protects: a backend ended with the transaction open never commits it, and the worker
    journals the operation as certainly failed (``fail``), not as unknown."""
    result = session.run(RunConfig(schedule=chaos.parse(f"A@charge.before_db_commit#{hit}:1*terminate"),
                                   store=pg_dsn))
    event = _assert_terminated_and_met(result, "before_db_commit")
    worker_pid = event.get("backend_pids")[0]  # the worker's own session; the heartbeat's may follow
    assert event.get("states")[str(worker_pid)] == "idle in transaction"  # ended with the transaction open
    op = _op_after(_terminated(result)[1])
    assert (op.kind, op.type) == (kind, "fail")
    if kind == "commit":  # A's transition never landed: someone else's claim, with a higher fence, did
        # (A holds the claim it is committing under; with kind "claim" A may never hold one: its claim
        # was lost and another worker may take the step before A asks again)
        fence = next(e.get("fence") for e in result.history.events
                     if e.process == "A" and e.kind == "claim" and e.type == "ok" and e.get("step") == "charge"
                     and e.get("instance") == event.get("instance"))
        assert not [e for e in result.history.of("store", "committed")
                    if e.get("step") == "charge" and e.get("worker") == "A" and e.get("fence") == fence
                    and e.get("instance") == event.get("instance")]


# -- the command line ---------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["replay", "A@charge.before_commit:terminate"],
    ["replay", "A@charge.in_db_commit:kill"],
    ["matrix", "--actions", "kill,terminate"],
    ["matrix", "--points", "before_db_commit", "--steps", "charge"],
])
def test_terminate_and_the_db_points_on_sqlite_exit_2_with_one_line_naming_the_store(capsys, argv):
    """Protects: a fault SQLite cannot carry out is refused up front, never run to an unknown verdict."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert "sqlite" in line and "postgresql://" in line


def test_matrix_terminate_on_postgres_covers_every_point_and_both_db_points(pg_dsn, capsys):
    """Protects: ``killpoint matrix --actions terminate`` on PostgreSQL runs every point and both db
    points (in the claim, receipt and commit transactions), each fired, all valid."""
    code = main(["matrix", "--json", "--store", pg_dsn, "--actions", "terminate", "--steps", "charge"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["valid"] is True, report["unknown"]
    schedules = {r["schedule"] for r in report["results"]}
    assert schedules == {f"A@charge.{p}:1*terminate" for p in DEFAULT_POINTS} | \
        {f"A@charge.{p}{'#%d' % h if h > 1 else ''}:1*terminate" for p in DB_POINTS for h in (1, 2, 3)}
    assert all(r["unfired"] == [] for r in report["results"])
