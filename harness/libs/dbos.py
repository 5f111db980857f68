"""DBOS as a target: the order as a DBOS workflow, each step a DBOS step that calls the downstream.

Each worker process launches DBOS after the fork (``DBOS()`` and ``DBOS.launch()`` start threads,
which a fork would not carry) on one SQLite system database per run, with its killpoint worker id as
DBOS's executor id. That is what makes DBOS's own recovery the recovery under test:

* a worker that replaces a dead one launches DBOS with the dead worker's executor id, and DBOS's
  launch recovery re-enqueues the workflows that executor left pending: DBOS's documented recovery
  for a self-hosted executor that restarts under its id (``executor_id`` in the config, or
  ``DBOS__VMID``). A fresh killpoint identity that replaces a dead one is a new process given the
  old one's executor id, as an orchestrator restarting a dead VM does; the executor id a worker ran
  under is kept in the run's folder (``dbos-executors/``), so a replacement of a replacement takes
  the same one. Recovery re-enqueues only workflows still pending on that executor, so it never
  takes one a live worker runs. (DBOS also documents an admin endpoint that recovers another
  executor's workflows, ``POST /dbos-workflow-recovery``; DBOS 3.4 ships no admin server, and the
  call behind it, ``DBOS._recover_pending_workflows``, is private: neither is used.)
* a worker that is merely paused keeps its workflow: no other executor takes it (DBOS has no lease),
  the others find nothing for them and exit, and the paused one finishes once resumed.

Recovery re-enqueues a workflow on the queue it came from, so the workflows are enqueued on a queue
of ours polled every few milliseconds (``polling_interval_sec``, a public setting); DBOS's internal
queue, where a directly started workflow would be recovered, is polled once a second. The
application version is pinned, so recovery never skips a workflow over a version hash.

Crash points: ``before_call`` and ``after_call`` inside the step, around the HTTP call;
``after_step`` in the workflow once the step returned and DBOS recorded its output.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from typing import Any

import killpoint
from killpoint.harness.jobs import at_exit
from killpoint.harness.libs.common import (TIMING, Downstream, guard_sqlalchemy, install_guard, monotonic_ns,
                                           order_workload)

# Imported in the parent, before any fork: DBOS costs about a second to import, its SQLite dialect
# (imported by the first launch) a fifth of one more.
from dbos import DBOS, DBOSClient, SetWorkflowID  # noqa: E402
import sqlalchemy.dialects.sqlite  # noqa: E402,F401
import sqlalchemy.dialects.sqlite.pysqlite  # noqa: E402,F401

POINTS = ("before_call", "after_call", "after_step")
APP_NAME = "killpoint"
APP_VERSION = "killpoint-orders-1"  # pinned: recovery must not depend on a hash of this file
QUEUE = "killpoint_orders"
QUEUE_POLL_S = 0.005
WORKFLOW = "killpoint_order"
TERMINAL = frozenset({"SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"})
DB_FILE = "dbos-system.sqlite"
EXECUTORS = "dbos-executors"  # in the run's folder: worker id -> the DBOS executor id it ran under

logging.getLogger("dbos").setLevel(logging.WARNING)

# This worker process's own: set once DBOS is launched in it (never in the harness).
_worker: dict[str, Any] = {}
_template: dict[int, str] = {}  # parent pid -> a migrated, empty system database to copy per run


def _url(run_dir: str) -> str:
    return f"sqlite:///{os.path.join(run_dir, DB_FILE)}"


# -- the workflow ---------------------------------------------------------------------------------


@DBOS.step(name="killpoint_call")
def call_step(instance: str, step: str) -> dict[str, Any]:
    """One call to the downstream: the step's effect. Its output is DBOS's record of it."""
    ctx = _worker["ctx"]
    spec = ctx.workload.instance(instance).step(step)
    if _worker["keyed"]:
        key = f"{DBOS.workflow_id}:{DBOS.step_id}"  # the same on every attempt of this step
    else:
        key = uuid.uuid4().hex  # a new key per attempt: the bug killpoint finds
    with ctx.at(instance, step):
        ctx.point("before_call")
        status, body = _worker["http"].post(spec.resource, spec.params, key=key, instance=instance, step=step)
        ctx.point("after_call")
    if status >= 300:
        raise RuntimeError(f"{spec.resource} answered {status}: {body}")
    return {"status": status, "effect": body.get("effect_id"), "replay": bool(body.get("replay"))}


@DBOS.workflow(name=WORKFLOW)
def order_workflow(instance: str) -> str:
    ctx = _worker["ctx"]
    for spec in ctx.workload.instance(instance).steps:
        call_step(instance, spec.name)
        with ctx.at(instance, spec.name):
            ctx.point("after_step")
    return "done"


# -- in a worker ----------------------------------------------------------------------------------


def _executor_path(run_dir: str, worker_id: str) -> str:
    return os.path.join(run_dir, EXECUTORS, worker_id)


def executor_of(ctx: Any) -> str:
    """The DBOS executor id this worker runs under: its own id on a first start; the executor id of
    the dead worker it replaces otherwise (whose launch recovery then takes that executor's pending
    workflows). Written to the run's folder before DBOS launches, with the time, for a replacement
    of this one and for :func:`history` to tell which worker ran a step under a shared executor id."""
    executor = ctx.worker_id
    if ctx.replaces is not None:
        executor = _executors(ctx.run_dir).get(ctx.replaces, (ctx.replaces, 0.0))[0]
    path = _executor_path(ctx.run_dir, ctx.worker_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        fh.write(f"{executor}\n{time.time() * 1000:.3f}")
    os.replace(path + ".tmp", path)
    return executor


def _executors(run_dir: str) -> dict[str, tuple[str, float]]:
    """worker id -> (the executor id it ran under, when it took it, epoch ms); a worker that died
    before it took one is missing (no workflow ran under it)."""
    folder = os.path.join(run_dir, EXECUTORS)
    out: dict[str, tuple[str, float]] = {}
    for worker in os.listdir(folder) if os.path.isdir(folder) else ():
        if worker.endswith(".tmp"):
            continue
        with open(os.path.join(folder, worker)) as fh:
            executor, _, at = fh.read().partition("\n")
        out[worker] = (executor, float(at or 0))
    return out


def _runner(executors: dict[str, tuple[str, float]], executor: str, started_ms: float | None) -> str:
    """The worker that ran a step started at ``started_ms`` under ``executor``: the last to take that
    executor id before then (one takes it only once the previous holder died)."""
    took = [(at, worker) for worker, (e, at) in executors.items()
            if e == executor and (started_ms is None or at <= started_ms)]
    return max(took)[1] if took else executor


def _launch(ctx: Any, keyed: bool, executor: str) -> None:
    """Launch DBOS in this worker process, once, as DBOS executor ``executor``."""
    if _worker.get("ctx") is ctx:
        return
    guard_sqlalchemy(install_guard(ctx))
    _worker.update(ctx=ctx, keyed=keyed, http=Downstream(ctx.downstream_url, ctx.worker_id))
    DBOS(config={"name": APP_NAME, "system_database_url": _url(ctx.run_dir), "executor_id": executor,
                 "application_version": APP_VERSION, "log_level": "WARNING", "run_migrations": False,
                 "system_database_engine": _engine(ctx.run_dir)})
    DBOS.launch()  # recovers ``executor``'s pending workflows; the queue is registered already (see setup)


def _engine(run_dir: str) -> Any:
    """The system database engine DBOS would make (IMMEDIATE transactions, a 30 s busy timeout), on
    a WAL file with ``synchronous=NORMAL``: as safe against a killed process as DBOS's default
    (the OS keeps what a dead process wrote), without an fsync per step."""
    import sqlalchemy as sa
    from sqlalchemy import event

    engine = sa.create_engine(_url(run_dir), pool_size=20, max_overflow=0, pool_timeout=30)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


def _statuses(run_dir: str, ids: list[str]) -> list[tuple[str, str]]:
    """(status, executor id) of the workflows ``ids``, read from the system database with sqlite3
    (cheaper than DBOS's own listing, which a worker waiting for the end would call every poll)."""
    db = sqlite3.connect(f"file:{os.path.join(run_dir, DB_FILE)}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(f"SELECT status, executor_id FROM workflow_status WHERE workflow_uuid IN "
                          f"({','.join('?' * len(ids))})", ids).fetchall()
    finally:
        db.close()


def _nothing_for(executor: str, rows: list[tuple[str, str]], ids: list[str]) -> bool:
    """Every workflow is enqueued, and each unfinished one runs on another executor."""
    return len(rows) == len(ids) and not any(
        status == "ENQUEUED" or (status == "PENDING" and on == executor) for status, on in rows)


def _work(ctx: Any, keyed: bool) -> None:
    ids = [inst.id for inst in ctx.workload.instances]
    executor = executor_of(ctx)
    if ctx.replaces is None and _nothing_for(executor, _statuses(ctx.run_dir, ids), ids):
        return  # read before launching: this worker would only launch DBOS to exit
    _launch(ctx, keyed, executor)
    for instance in ids:
        with SetWorkflowID(instance):  # the workflow id is the instance: enqueuing again is a no-op
            DBOS.enqueue_workflow(QUEUE, order_workflow, instance)
    poll = max(TIMING.poll_ms, 5.0) / 1000.0
    while True:
        rows = _statuses(ctx.run_dir, ids)
        if len(rows) == len(ids) and all(status in TERMINAL for status, _ in rows):
            return
        if _nothing_for(executor, rows, ids):
            # Every unfinished workflow runs on another executor, alive (perhaps paused) or to be
            # recovered by the worker that replaces it: nothing here for this worker.
            return
        time.sleep(poll)


# -- in the harness -------------------------------------------------------------------------------


def _migrated_template() -> str:
    """An empty system database DBOS has migrated, with our queue, made once per process and copied
    per run (migrating a new one costs more than the rest of a run)."""
    path = _template.get(os.getpid())
    if path is None or not os.path.exists(path):
        folder = tempfile.mkdtemp(prefix="killpoint-dbos-")
        at_exit(_remove_template, folder, os.getpid())  # a --jobs runner's too
        path = os.path.join(folder, DB_FILE)
        DBOS.migrate(f"sqlite:///{path}")
        # The queue is in the template, so a worker's queue thread finds it when DBOS launches (one
        # registered after launch is only picked up at the queue thread's next check, a second on).
        client = DBOSClient(system_database_url=f"sqlite:///{path}", application_name=APP_NAME)
        try:
            client.register_queue(QUEUE, worker_concurrency=1, polling_interval_sec=QUEUE_POLL_S)
        finally:
            client.destroy()
        db = sqlite3.connect(path)
        db.execute("PRAGMA journal_mode=WAL")  # kept by the file, so by every copy of it
        db.close()
        _template[os.getpid()] = path
    return path


def _remove_template(folder: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked child inherits the hook; only the process that made it removes it
        shutil.rmtree(folder, ignore_errors=True)


def setup(run: killpoint.TargetRun) -> None:
    shutil.copyfile(_migrated_template(), os.path.join(run.run_dir, DB_FILE))  # WAL: no -wal file yet


def _read(run: killpoint.TargetRun, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    path = os.path.join(run.run_dir, DB_FILE)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def done(run: killpoint.TargetRun) -> bool:
    ids = [inst.id for inst in run.workload.instances]
    rows = _read(run, f"SELECT workflow_uuid, status FROM workflow_status WHERE workflow_uuid IN "
                      f"({','.join('?' * len(ids))})", tuple(ids))
    return len(rows) == len(ids) and all(status in TERMINAL for _, status in rows)


def _outputs(run: killpoint.TargetRun) -> dict[tuple[str, int], tuple[Any, ...]]:
    rows = _read(run, "SELECT workflow_uuid, function_id, function_name, error, started_at_epoch_ms, "
                      "completed_at_epoch_ms FROM operation_outputs")
    return {(r[0], r[1]): r for r in rows if r[2] == "killpoint_call"}


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    """Each step's state from DBOS's own records: its recorded output, else its workflow's status."""
    outputs = _outputs(run)
    status = dict(_read(run, "SELECT workflow_uuid, status FROM workflow_status"))
    states: dict[tuple[str, str], str] = {}
    for inst in run.workload.instances:
        for n, spec in enumerate(inst.steps, start=1):
            out = outputs.get((inst.id, n))
            if out is not None:
                states[(inst.id, spec.name)] = "failed" if out[3] is not None else "succeeded"
            elif status.get(inst.id) in ("PENDING",):
                states[(inst.id, spec.name)] = "running"
            elif status.get(inst.id) in TERMINAL:
                states[(inst.id, spec.name)] = "cancelled"
            else:
                states[(inst.id, spec.name)] = "pending"
    return states


def history(run: killpoint.TargetRun) -> list[dict[str, Any]]:
    """DBOS's operation outputs as store events: the step claimed when its recorded attempt
    started, committed when DBOS recorded its output (function id n is the workflow's n-th step),
    by the worker that held the workflow's executor id then (``executor`` says which id that was)."""
    outputs = _outputs(run)
    executor = dict(_read(run, "SELECT workflow_uuid, executor_id FROM workflow_status"))
    executors = _executors(run.run_dir)
    events: list[dict[str, Any]] = []
    now = time.monotonic_ns()
    for inst in run.workload.instances:
        for n, spec in enumerate(inst.steps, start=1):
            out = outputs.get((inst.id, n))
            if out is None:
                continue
            on = executor.get(inst.id)
            base = {"instance": inst.id, "step": spec.name, "executor": on,
                    "worker": on if on is None else _runner(executors, on, out[4]),
                    "source": "dbos.operation_outputs", "function_id": n}
            started, finished = monotonic_ns(out[4], now), monotonic_ns(out[5], now)
            events.append({**base, "t": started, "kind": "claimed", "from_state": "pending",
                           "to_state": "running", "state_version": 1, "attempt": 1})
            events.append({**base, "t": max(finished, started + 1), "kind": "committed", "from_state": "running",
                           "to_state": "failed" if out[3] is not None else "succeeded", "state_version": 2})
    return events


def _declare(variant: str) -> killpoint.Target:
    keyed = variant == "keyed"

    def body(ctx: killpoint.WorkerContext) -> None:
        _work(ctx, keyed)

    return killpoint.Target(body, name=f"dbos:{variant}", points=POINTS, owns_state=True,
                            workload="killpoint.harness.libs.common:order_workload", setup=setup,
                            done=done, final_states=final_states, history=history)


naive = _declare("naive")
keyed = _declare("keyed")
TARGETS = {"naive": naive, "keyed": keyed}


def target_named(variant: str) -> killpoint.Target:
    try:
        return TARGETS[variant]
    except KeyError:
        raise killpoint.InvalidTarget(f"unknown DBOS target {variant!r}: known are "
                                      f"{', '.join('dbos:' + v for v in TARGETS)}") from None


__all__ = ["POINTS", "final_states", "history", "keyed", "naive", "order_workload", "target_named"]
