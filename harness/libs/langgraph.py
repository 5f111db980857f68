"""LangGraph as a target: the order as a graph, one node per step, checkpointed by ``SqliteSaver``.

Each run has one SQLite file in its folder with LangGraph's checkpoint tables and, beside them, a
lease table of ours. LangGraph has no owner for a thread: two workers that resume the same thread
id both run it. So a worker takes the thread's lease first (a fencing counter raised on every take,
an expiry in database time, renewed by a heartbeat thread while it works) and then resumes the thread
the way LangGraph does, by its thread id (``graph.invoke(None, config)`` once a checkpoint exists).
The checkpointer is fenced: every checkpoint write first checks, in the same SQLite transaction,
that the lease is still this worker's, and each node calls the downstream with the lease's fence,
so a worker that was paused past its lease can neither write a checkpoint nor apply an effect.

The checkpointer serializes its writes on its own lock; a pause takes that lock first (it is one of
the failpoints' pause locks), so a frozen worker never holds the SQLite file's write lock.

LangGraph's durability mode is a target option (``langgraph:naive:sync``); the default is
LangGraph's own, ``async``:

``sync``   a step's checkpoint is written before the next step starts;
``async``  it is written while the next step runs (a crash may lose it);
``exit``   nothing is written until the graph exits: a crash loses every finished node.

Crash points: ``before_call`` and ``after_call`` inside each node, around the HTTP call.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sqlite3
import threading
import time
from datetime import datetime
from typing import Annotated, Any, Iterator, TypedDict

import killpoint
from killpoint import vocab
from killpoint.harness.libs.common import TIMING, Downstream, monotonic_ns, order_workload

# Imported in the parent, before any fork: LangGraph costs about a second to import.
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

POINTS = ("before_call", "after_call")
DURABILITY = ("sync", "async", "exit")
DEFAULT_DURABILITY = "async"  # LangGraph's own default
DB_FILE = "langgraph.sqlite"

LEASES = """
CREATE TABLE IF NOT EXISTS killpoint_leases (
    thread_id TEXT PRIMARY KEY, owner TEXT, fence INTEGER NOT NULL DEFAULT 0, expires_at REAL,
    done INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS killpoint_lease_log (
    thread_id TEXT NOT NULL, owner TEXT NOT NULL, fence INTEGER NOT NULL, at REAL NOT NULL);
"""
# Database time in seconds (the lease's clock is the database's, never a worker's).
NOW = "(julianday('now') - 2440587.5) * 86400.0"


class LeaseLost(Exception):
    """This worker's lease on a thread is no longer current: another worker took it over."""


class State(TypedDict, total=False):
    instance: str
    results: Annotated[dict[str, Any], operator.or_]


class FencedSaver(SqliteSaver):
    """LangGraph's SQLite checkpointer, whose every write first checks the writer's lease.

    The check runs in the write's own transaction (``BEGIN IMMEDIATE``, under the saver's lock), so no
    takeover can slip between the check and the write.
    """

    holding: tuple[str, str, int] | None = None  # (thread id, owner, fence) while a lease is held

    @contextlib.contextmanager
    def cursor(self, transaction: bool = True) -> Iterator[sqlite3.Cursor]:
        with super().cursor(transaction) as cur:
            if transaction and self.holding is not None:
                thread_id, owner, fence = self.holding
                cur.execute("BEGIN IMMEDIATE")
                ok = cur.execute("SELECT 1 FROM killpoint_leases WHERE thread_id = ? AND owner = ? AND fence = ?",
                                 (thread_id, owner, fence)).fetchone()
                if ok is None:
                    self.conn.rollback()
                    raise LeaseLost(f"thread {thread_id}: lease {fence} of {owner} was taken over")
            yield cur


def _connect(path: str) -> sqlite3.Connection:
    return sqlite3.connect(path, check_same_thread=False, timeout=30)


# -- the graph ------------------------------------------------------------------------------------

_worker: dict[str, Any] = {}  # this worker process's own (never set in the harness)


def _node(step: str) -> Any:
    def run(state: State) -> dict[str, Any]:
        ctx, lease = _worker["ctx"], _worker["lease"]
        instance = state["instance"]
        spec = ctx.workload.instance(instance).step(step)
        thread_id = instance  # each order is the thread of its own id
        key = f"{thread_id}:{step}" if _worker["keyed"] else os.urandom(16).hex()
        with ctx.at(instance, step):
            ctx.point("before_call")
            status, body = _call(ctx, spec, key, instance, step, lease)
            ctx.point("after_call")
        if status >= 300:
            raise RuntimeError(f"{spec.resource} answered {status}: {body}")
        return {"results": {step: {"effect": body.get("effect_id"), "replay": bool(body.get("replay"))}}}

    run.__name__ = step
    return run


def _call(ctx: Any, spec: Any, key: str, instance: str, step: str, lease: "Lease") -> tuple[int, dict[str, Any]]:
    for _ in range(200):
        status, body = _worker["http"].post(spec.resource, spec.params, key=key, instance=instance, step=step,
                                            fence=lease.fence, scope=lease.thread_id)
        if status == 409 and body.get("error") == "stale_fence":
            raise LeaseLost(f"thread {lease.thread_id}: the downstream has seen a newer fence than {lease.fence}")
        if status == 409 and body.get("error") == "in_flight":
            time.sleep(TIMING.poll_ms / 1000.0)  # the earlier holder's call with this key is still running
            continue
        return status, body
    raise RuntimeError(f"{spec.resource}: key {key!r} stayed in flight")


def build_graph(workload: Any) -> Any:
    """The order as a graph: one node per step of the workload's (single) definition, in order."""
    steps = [s.name for s in workload.instances[0].steps]
    graph = StateGraph(State)
    for step in steps:
        graph.add_node(step, _node(step))
    for a, b in zip([START, *steps], [*steps, END]):
        graph.add_edge(a, b)
    return graph


# -- leases ---------------------------------------------------------------------------------------


class Lease:
    def __init__(self, saver: FencedSaver, owner: str, thread_id: str, fence: int, ttl_s: float) -> None:
        self.saver, self.owner, self.thread_id, self.fence, self.ttl_s = saver, owner, thread_id, fence, ttl_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            with self.saver.lock:
                renewed = self.saver.conn.execute(
                    f"UPDATE killpoint_leases SET expires_at = {NOW} + ? WHERE thread_id = ? AND owner = ? "
                    f"AND fence = ?", (self.ttl_s, self.thread_id, self.owner, self.fence)).rowcount
                self.saver.conn.commit()
            if not renewed:
                self.lost = True
                return

    def release(self, done: bool) -> None:
        self._stop.set()
        with self.saver.lock:
            self.saver.conn.execute("UPDATE killpoint_leases SET owner = NULL, expires_at = NULL, done = ? "
                                    "WHERE thread_id = ? AND owner = ? AND fence = ?",
                                    (1 if done else 0, self.thread_id, self.owner, self.fence))
            self.saver.conn.commit()


def _take(saver: FencedSaver, owner: str, ttl_s: float) -> Lease | None:
    """Lease the first unfinished thread whose lease is free or expired, raising its fence."""
    with saver.lock:
        conn = saver.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(f"SELECT thread_id FROM killpoint_leases WHERE done = 0 AND "
                               f"(owner IS NULL OR expires_at < {NOW}) ORDER BY thread_id LIMIT 1").fetchone()
            if row is None:
                conn.commit()
                return None
            fence = conn.execute(f"UPDATE killpoint_leases SET owner = ?, fence = fence + 1, expires_at = {NOW} + ? "
                                 f"WHERE thread_id = ? RETURNING fence", (owner, ttl_s, row[0])).fetchone()[0]
            conn.execute(f"INSERT INTO killpoint_lease_log VALUES (?, ?, ?, {NOW})", (row[0], owner, fence))
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
    return Lease(saver, owner, row[0], fence, ttl_s)


def _all_done(saver: FencedSaver) -> bool:
    with saver.lock:
        return saver.conn.execute("SELECT count(*) FROM killpoint_leases WHERE done = 0").fetchone()[0] == 0


# -- in a worker ----------------------------------------------------------------------------------


def _work(ctx: Any, keyed: bool, durability: str) -> None:
    saver = FencedSaver(_connect(os.path.join(ctx.run_dir, DB_FILE)))
    ctx.pause_waits_for(saver.lock)  # a pause never freezes a checkpoint write (or a lease's)
    graph = build_graph(ctx.workload).compile(checkpointer=saver)
    _worker.update(ctx=ctx, keyed=keyed, http=Downstream(ctx.downstream_url, ctx.worker_id))
    ttl_s = TIMING.lease_ttl_ms / 1000.0
    while not _all_done(saver):
        lease = _take(saver, ctx.worker_id, ttl_s)
        if lease is None:  # every unfinished thread is leased by a live worker: wait for it
            time.sleep(TIMING.poll_ms / 1000.0)
            continue
        _worker["lease"] = lease
        saver.holding = (lease.thread_id, lease.owner, lease.fence)
        config: Any = {"configurable": {"thread_id": lease.thread_id}}
        try:
            started = saver.get_tuple(config) is not None
            # Resume by thread id, as LangGraph does: from the last checkpoint, or from the input.
            graph.invoke(None if started else {"instance": lease.thread_id}, config, durability=durability)
            finished = not graph.get_state(config).next
        except LeaseLost as exc:
            ctx.journal.write(vocab.LEASE_LOST, instance=lease.thread_id, fence=lease.fence, error=str(exc))
            saver.holding = None
            lease.release(done=False)  # a no-op: the lease is another worker's now
            continue
        saver.holding = None
        lease.release(done=finished)


# -- in the harness -------------------------------------------------------------------------------


def workload(seed: int = 0) -> Any:
    """The library order, its resources fenced (a worker sends its lease's fence)."""
    wl = order_workload(seed)
    return type(wl)(wl.name, wl.instances, {r: {"legacy": False, "fencing": True} for r in wl.resources})


def setup(run: killpoint.TargetRun) -> None:
    conn = _connect(os.path.join(run.run_dir, DB_FILE))
    try:
        SqliteSaver(conn).setup()  # LangGraph's own tables (and WAL)
        conn.executescript(LEASES)
        conn.executemany("INSERT INTO killpoint_leases (thread_id) VALUES (?)",
                         [(inst.id,) for inst in run.workload.instances])
        conn.commit()
    finally:
        conn.close()


def done(run: killpoint.TargetRun) -> bool:
    conn = _connect(os.path.join(run.run_dir, DB_FILE))
    try:
        return conn.execute("SELECT count(*) FROM killpoint_leases WHERE done = 0").fetchone()[0] == 0
    finally:
        conn.close()


def _checkpoints(run: killpoint.TargetRun) -> dict[str, list[tuple[float, dict[str, Any], dict[str, Any]]]]:
    """Per thread, its checkpoints oldest first: (time, results so far, metadata)."""
    conn = _connect(os.path.join(run.run_dir, DB_FILE))
    saver = SqliteSaver(conn)
    out: dict[str, list[tuple[float, dict[str, Any], dict[str, Any]]]] = {}
    try:
        for inst in run.workload.instances:
            rows = []
            for tup in saver.list({"configurable": {"thread_id": inst.id}}):
                ts = datetime.fromisoformat(tup.checkpoint["ts"]).timestamp()
                results = dict(tup.checkpoint.get("channel_values", {}).get("results") or {})
                # Writes saved for a task of this checkpoint count as done: resume does not re-run it.
                for _task, channel, value in tup.pending_writes or ():
                    if channel == "results" and isinstance(value, dict):
                        results.update(value)
                rows.append((ts, results, dict(tup.metadata or {})))
            out[inst.id] = sorted(rows, key=lambda r: r[0])
    finally:
        conn.close()
    return out


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    """A step succeeded once a checkpoint (or its saved writes) holds its result."""
    checkpoints = _checkpoints(run)
    states: dict[tuple[str, str], str] = {}
    for inst in run.workload.instances:
        rows = checkpoints.get(inst.id) or []
        results = rows[-1][1] if rows else {}
        for spec in inst.steps:
            states[(inst.id, spec.name)] = "succeeded" if spec.name in results else ("running" if rows else "pending")
    return states


def history(run: killpoint.TargetRun) -> list[dict[str, Any]]:
    """The checkpoints as store events: each step committed at the first checkpoint holding its result,
    claimed by the lease that wrote it (from the lease log)."""
    checkpoints = _checkpoints(run)
    conn = _connect(os.path.join(run.run_dir, DB_FILE))
    try:
        log = conn.execute("SELECT thread_id, owner, fence, at FROM killpoint_lease_log ORDER BY at").fetchall()
    finally:
        conn.close()
    now = time.monotonic_ns()
    events: list[dict[str, Any]] = []
    for inst in run.workload.instances:
        seen: set[str] = set()
        for ts, results, _meta in checkpoints.get(inst.id) or ():
            for spec in inst.steps:
                if spec.name not in results or spec.name in seen:
                    continue
                seen.add(spec.name)
                claims = [r for r in log if r[0] == inst.id and r[3] <= ts]
                claim = claims[-1] if claims else None
                base = {"instance": inst.id, "step": spec.name, "source": "langgraph.checkpoints",
                        "worker": claim[1] if claim else None}
                committed_t = monotonic_ns(ts * 1000, now)
                claimed_t = monotonic_ns(claim[3] * 1000, now) if claim else committed_t - 1
                events.append({**base, "t": min(claimed_t, committed_t - 1), "kind": "claimed", "from_state": "pending",
                               "to_state": "running", "state_version": 1, "attempt": 1})
                events.append({**base, "t": committed_t, "kind": "committed", "from_state": "running",
                               "to_state": "succeeded", "state_version": 2})
    return events


def _declare(variant: str, durability: str) -> killpoint.Target:
    keyed = variant == "keyed"

    def body(ctx: killpoint.WorkerContext) -> None:
        _work(ctx, keyed, durability)

    name = f"langgraph:{variant}" + ("" if durability == DEFAULT_DURABILITY else f":{durability}")
    return killpoint.Target(body, name=name, points=POINTS, owns_state=True,
                            workload="killpoint.harness.libs.langgraph:workload", setup=setup, done=done,
                            final_states=final_states, history=history)


TARGETS = {f"{v}:{d}": _declare(v, d) for v in ("naive", "keyed") for d in DURABILITY}
naive, keyed = TARGETS[f"naive:{DEFAULT_DURABILITY}"], TARGETS[f"keyed:{DEFAULT_DURABILITY}"]


def target_named(variant: str) -> killpoint.Target:
    """``naive`` or ``keyed``, optionally with a durability mode: ``keyed:sync``."""
    name = variant if variant.count(":") == 1 else f"{variant}:{DEFAULT_DURABILITY}"
    try:
        return TARGETS[name]
    except KeyError:
        raise killpoint.InvalidTarget(
            f"unknown LangGraph target {variant!r}: known are langgraph:naive and langgraph:keyed, "
            f"optionally with a durability mode ({', '.join(DURABILITY)}), as in langgraph:keyed:sync") from None


__all__ = ["DURABILITY", "POINTS", "build_graph", "final_states", "history", "keyed", "naive", "target_named",
           "workload"]
