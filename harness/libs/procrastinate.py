"""procrastinate as a target: the order as one procrastinate job on PostgreSQL, run by its workers.

Each harness process applies procrastinate's schema once, in a PostgreSQL schema of its own, and
each run defers its orders on a queue of its own. A worker process runs procrastinate's worker (its
own job fetching, heartbeats, and statuses) with the killpoint worker id as its name.

A job whose worker was killed stays in ``doing``: nobody finishes it. procrastinate's recovery for it
is the stalled-job retry (``get_stalled_jobs`` finds the ``doing`` jobs of workers whose heartbeat is
older than a bound, ``retry_job`` puts them back to ``todo``), which every worker here runs before it
looks for work. The heartbeat comes every 50 ms and the stalled bound is 500 ms (``STALLED_S``), so a
worker paused past that bound is taken for dead too, as procrastinate would in production.

Every query of the worker goes through the connector, which enters the pause guard
(:mod:`killpoint.harness.libs.common`): a paused worker never sits frozen inside a transaction.

Crash points: ``before_call`` and ``after_call`` around each step's HTTP call inside the job.

``history()`` reads procrastinate's own record of each job's life, the ``procrastinate_events`` rows
its triggers write on every status change (deferred, started, deferred_for_retry, succeeded, failed,
cancelled, aborted, retried), and walks each job's chain: every change is a transition of each step
of the order (procrastinate knows the job, not the steps inside it), from the state the chain left it
in (never from what the event's name promises) to the state the event names. ``legal_transitions``
then judges procrastinate's own status path against killpoint's table, where the two can differ: a
failed job retried by hand (``retried``, failed -> todo) or a todo job finished without running is a
path procrastinate allows and the table refuses, as is any recorded path that skips a state (a job
started again after it succeeded would read ``succeeded -> running``). ``state_version`` is numbered
here, +1 per recorded change, so ``version_chain`` holds by construction: it says the changes form one
chain per step, no more. procrastinate records no worker and no fence with a change (any worker may
finish a ``doing`` job), so the events carry neither, and the lease invariants have no fence of
procrastinate's to compare.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from typing import Any, Iterable, Mapping, Sequence

import killpoint
from killpoint import vocab
from killpoint.harness.jobs import at_exit
from killpoint.harness.libs.common import (TIMING, Downstream, PauseGuard, install_guard, monotonic_ns,
                                           order_workload)

# Imported in the parent, before any fork.
import procrastinate  # noqa: E402
import psycopg  # noqa: E402
from procrastinate.schema import SchemaManager  # noqa: E402

POINTS = ("before_call", "after_call")
# procrastinate's heartbeat period and stalled bound (its production defaults are 10 s and 30 s).
# Real time: procrastinate reads PostgreSQL's now(), which the run clock does not move. The bound is
# what the retry of a killed or frozen worker's job waits, so it is short, but well above a lapse
# that load makes. It was 120 ms (the real-time lease), and once in CI the naive matrix reported
# legal_transitions beside its duplicates, which no run here showed, quiet or loaded: the one way
# procrastinate's events make a refused path is a job finished from ``todo``, by a worker still
# running it after its job was retried under it (procrastinate takes that finish; it has no fence),
# and a live worker is retried only when its heartbeat is late by the bound.
HEARTBEAT_S = 0.05
STALLED_S = 0.5
TASK = "killpoint_order"
# A job's status as its steps' state. An aborted job stopped while it ran: killpoint's table lets a
# running step end failed, never cancelled (only a step that has not started is cancelled).
FINAL = {"succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled", "aborted": "failed",
         "doing": "running", "todo": "pending"}
# procrastinate's event types that change a job's status -> the state they leave its steps in
# ("cancelled" is also what its trigger writes for a todo job finished as succeeded or failed without
# running; the job's status then says which). "abort_requested" and "scheduled" change no status.
EVENT_STATE = {"started": "running", "deferred_for_retry": "retry_scheduled", "succeeded": "succeeded",
               "failed": "failed", "cancelled": "cancelled", "aborted": "failed", "retried": "retry_scheduled"}
_schemas: dict[int, tuple[str, str]] = {}  # harness pid -> (conninfo, schema with procrastinate's tables)
_worker: dict[str, Any] = {}  # this worker process's own

blueprint = procrastinate.Blueprint()


@blueprint.task(name=TASK, pass_context=True)
def order_job(context: procrastinate.JobContext, instance: str) -> None:
    """The order: its steps in order, each one call to the downstream."""
    ctx = _worker["ctx"]
    job_id = context.job.id
    for spec in ctx.workload.instance(instance).steps:
        key = f"{job_id}:{spec.name}" if _worker["keyed"] else os.urandom(16).hex()
        with ctx.at(instance, spec.name):
            ctx.point("before_call")
            status, body = _call(ctx, spec, key, instance)
            ctx.point("after_call")
        if status >= 300:
            raise RuntimeError(f"{spec.resource} answered {status}: {body}")


def _call(ctx: Any, spec: Any, key: str, instance: str) -> tuple[int, dict[str, Any]]:
    for _ in range(200):
        status, body = _worker["http"].post(spec.resource, spec.params, key=key, instance=instance, step=spec.name)
        if status == 409 and body.get("error") == "in_flight":
            time.sleep(TIMING.poll_ms / 1000.0)  # a stalled run of this job is still calling
            continue
        return status, body
    raise RuntimeError(f"{spec.resource}: key {key!r} stayed in flight")


class _GuardedConnector(procrastinate.PsycopgConnector):
    """procrastinate's psycopg connector; each query holds the pause guard while it runs."""

    def __init__(self, guard: PauseGuard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._guard = guard

    async def execute_query_async(self, query: Any, **arguments: Any) -> None:
        self._guard.enter()
        try:
            await super().execute_query_async(query, **arguments)
        finally:
            self._guard.leave()

    async def execute_query_one_async(self, query: Any, **arguments: Any) -> Any:
        self._guard.enter()
        try:
            return await super().execute_query_one_async(query, **arguments)
        finally:
            self._guard.leave()

    async def execute_query_all_async(self, query: Any, **arguments: Any) -> Any:
        self._guard.enter()
        try:
            return await super().execute_query_all_async(query, **arguments)
        finally:
            self._guard.leave()


def _options(schema: str) -> dict[str, Any]:
    return {"options": f"-c search_path={schema}"}


# One app for the process (a blueprint's tasks belong to the app that adds them); each worker and
# each setup gives it its own connector with ``replace_connector``.
app = procrastinate.App(connector=procrastinate.PsycopgConnector())
app.add_tasks_from(blueprint, namespace="killpoint")


# -- in a worker ----------------------------------------------------------------------------------


def _work(ctx: Any, keyed: bool) -> None:
    state = ctx.run.state
    conninfo, schema, queue = state["conninfo"], state["schema"], state["queue"]
    guard = install_guard(ctx)
    connector = _GuardedConnector(guard, conninfo=conninfo, kwargs=_options(schema), min_size=1, max_size=3)
    _worker.update(ctx=ctx, keyed=keyed, http=Downstream(ctx.downstream_url, ctx.worker_id))
    poll_s = max(TIMING.poll_ms, 20.0) / 1000.0

    def unretrieved(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # procrastinate leaves the error of a job's finish in a task nobody awaits: a worker that
        # finishes a job another worker already finished (it was retried while this one was frozen)
        # is refused by procrastinate_finish_job. Journalled, not printed over the user's terminal.
        exc = context.get("exception")
        cause = exc.__cause__ if exc is not None and exc.__cause__ is not None else exc
        ctx.journal.write(vocab.LIBRARY_ERROR, error=f"{type(cause).__name__}: {cause}" if cause is not None
                          else str(context.get("message")))

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(unretrieved)
        async with app.open_async():  # the connector is ours in this process
            manager = app.job_manager
            while True:
                jobs = list(await manager.list_jobs_async(queue=queue))
                if jobs and all(j.status not in ("todo", "doing") for j in jobs):
                    return
                # procrastinate's recovery: the doing jobs of workers whose heartbeat stopped, retried.
                for job in await manager.get_stalled_jobs(queue=queue, seconds_since_heartbeat=STALLED_S):
                    try:
                        await manager.retry_job(job)
                    except procrastinate.exceptions.ConnectorException as exc:
                        if not _retried_already(exc):
                            raise
                await app.run_worker_async(queues=[queue], name=ctx.worker_id, concurrency=1, wait=False,
                                           fetch_job_polling_interval=poll_s, listen_notify=False,
                                           install_signal_handlers=False, delete_jobs="never",
                                           update_heartbeat_interval=HEARTBEAT_S, stalled_worker_timeout=STALLED_S)
                await asyncio.sleep(poll_s)

    with app.replace_connector(connector):
        asyncio.run(main())


def _retried_already(exc: BaseException) -> bool:
    """Another worker found the same stalled job and retried it first: procrastinate refuses the
    second retry of a job that is no longer ``doing``."""
    cause = exc.__cause__
    return isinstance(cause, psycopg.errors.RaiseException) and "invalid status to retry" in str(cause)


# -- in the harness -------------------------------------------------------------------------------


def _conninfo(run: killpoint.TargetRun) -> str:
    if str(run.store).startswith(("postgresql://", "postgres://")):
        return str(run.store)
    dsn = os.environ.get("KILLPOINT_PG_DSN")
    if not dsn:
        raise killpoint.InvalidTarget(f"procrastinate needs PostgreSQL, not --store {run.store}: run "
                                      f"with --store postgresql://... or set KILLPOINT_PG_DSN")
    return dsn


def _schema(conninfo: str) -> str:
    """procrastinate's tables, once per harness process, in a schema of its own."""
    got = _schemas.get(os.getpid())
    if got is not None and got[0] == conninfo:
        return got[1]
    schema = f"kp_procrastinate_{os.getpid()}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"SET search_path = {schema}")
        conn.execute(SchemaManager.get_schema())  # type: ignore[arg-type]
    _schemas[os.getpid()] = (conninfo, schema)
    # Dropped when this process ends, a --jobs runner too (its schemas once piled up: see at_exit).
    at_exit(_drop_schema, conninfo, schema, os.getpid())
    return schema


def _drop_schema(conninfo: str, schema: str, pid: int) -> None:
    if os.getpid() != pid:
        return  # a forked child inherits the hook; only the process that made the schema drops it
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    except psycopg.Error:
        pass


def _query(run: killpoint.TargetRun, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    state = run.state
    with psycopg.connect(state["conninfo"], autocommit=True, **_options(state["schema"])) as conn:
        return conn.execute(sql, args).fetchall()


def setup(run: killpoint.TargetRun) -> None:
    conninfo = _conninfo(run)
    schema = _schema(conninfo)
    # procrastinate notifies on a channel named after the queue, and a channel name is at most 63 bytes
    queue = "kp_" + hashlib.sha256(run.namespace.encode()).hexdigest()[:20]
    run.state.update(conninfo=conninfo, schema=schema, queue=queue)
    connector = procrastinate.SyncPsycopgConnector(conninfo=conninfo, kwargs=_options(schema), min_size=1, max_size=1)
    with app.replace_connector(connector), app.open():
        task = app.tasks[f"killpoint:{TASK}"]
        for inst in run.workload.instances:
            task.configure(queue=queue).defer(instance=inst.id)


def done(run: killpoint.TargetRun) -> bool:
    rows = _query(run, "SELECT status FROM procrastinate_jobs WHERE queue_name = %s", run.state["queue"])
    return bool(rows) and all(status not in ("todo", "doing") for (status,) in rows)


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    """Each step's state from its job's status (procrastinate knows jobs, not the steps inside)."""
    rows = _query(run, "SELECT args->>'instance', status FROM procrastinate_jobs WHERE queue_name = %s",
                  run.state["queue"])
    status = {instance: s for instance, s in rows}
    return {(inst.id, spec.name): FINAL.get(status.get(inst.id, "todo"), "pending")
            for inst in run.workload.instances for spec in inst.steps}


def job_events(rows: Iterable[Sequence[Any]], steps: Mapping[str, Sequence[str]], *,
               now: int) -> list[dict[str, Any]]:
    """Store events from procrastinate's event rows ``(event id, job id, type, epoch ms, instance,
    job status)``, for each step in ``steps[instance]``: ``created`` on ``deferred``, ``claimed`` on
    ``started`` (the job's n-th start is attempt n), ``committed`` on every other status change.
    Pure: ``now`` (CLOCK_MONOTONIC) places a row without a time; rows of one job in id order keep
    their order even where one transaction wrote several at the same ``now()``."""
    events: list[dict[str, Any]] = []
    chain: dict[int, dict[str, Any]] = {}  # job id -> its state, state_version, starts and last time
    for event_id, job_id, kind, at_ms, instance, status in sorted(rows, key=lambda r: (r[1], r[0])):
        job = chain.setdefault(job_id, {"state": None, "version": 0, "starts": 0, "t": None})
        t = monotonic_ns(at_ms, now)
        if job["t"] is not None and t <= job["t"]:
            t = job["t"] + 1
        if kind == "deferred":
            if job["state"] is not None:
                continue  # a job is deferred once; its insert trigger cannot fire again
            out: dict[str, Any] = {"kind": "created", "to_state": "pending"}
        elif kind in EVENT_STATE:
            to_state = EVENT_STATE[kind]
            if kind == "cancelled" and status in ("succeeded", "failed"):
                to_state = status  # finished from todo: the trigger's word, the job's real end
            out = {"kind": "claimed" if kind == "started" else "committed", "from_state": job["state"],
                   "to_state": to_state}
            if kind == "started":
                job["starts"] += 1
                out["attempt"] = job["starts"]
        else:
            continue
        job["version"] += 1
        job["state"], job["t"] = out["to_state"], t
        for step in steps.get(instance, ()):
            events.append({"t": t, "instance": instance, "step": step, "worker": None,
                           "source": "procrastinate.events", "job_id": job_id, "event_id": event_id,
                           "event": kind, "state_version": job["version"], **out})
    return events


def history(run: killpoint.TargetRun) -> list[dict[str, Any]]:
    """procrastinate's job events as store events on each step of the job's order (see the module
    docstring)."""
    rows = _query(run, "SELECT e.id, e.job_id, e.type::text, extract(epoch FROM e.at) * 1000, "
                       "j.args->>'instance', j.status::text FROM procrastinate_events e "
                       "JOIN procrastinate_jobs j ON j.id = e.job_id WHERE j.queue_name = %s",
                  run.state["queue"])
    steps = {inst.id: [spec.name for spec in inst.steps] for inst in run.workload.instances}
    return job_events([(r[0], r[1], r[2], None if r[3] is None else float(r[3]), r[4], r[5]) for r in rows],
                      steps, now=time.monotonic_ns())


def teardown(run: killpoint.TargetRun) -> None:
    if "queue" in run.state:
        _query(run, "DELETE FROM procrastinate_jobs WHERE queue_name = %s RETURNING id", run.state["queue"])


def _declare(variant: str) -> killpoint.Target:
    keyed = variant == "keyed"

    def body(ctx: killpoint.WorkerContext) -> None:
        _work(ctx, keyed)

    return killpoint.Target(body, name=f"procrastinate:{variant}", points=POINTS, owns_state=True,
                            workload="killpoint.harness.libs.common:order_workload", setup=setup, done=done,
                            final_states=final_states, history=history, teardown=teardown)


naive = _declare("naive")
keyed = _declare("keyed")
TARGETS = {"naive": naive, "keyed": keyed}


def target_named(variant: str) -> killpoint.Target:
    try:
        return TARGETS[variant]
    except KeyError:
        raise killpoint.InvalidTarget(f"unknown procrastinate target {variant!r}: known are "
                                      f"{', '.join('procrastinate:' + v for v in TARGETS)}") from None


__all__ = ["POINTS", "final_states", "history", "job_events", "keyed", "naive", "order_workload", "target_named"]
