"""procrastinate as a target: the order as one procrastinate job on PostgreSQL, run by its workers.

Each harness process applies procrastinate's schema once, in a PostgreSQL schema of its own, and
each run defers its orders on a queue of its own. A worker process runs procrastinate's worker (its
own job fetching, heartbeats, and statuses) with the killpoint worker id as its name.

A job whose worker was killed stays in ``doing``: nobody finishes it. procrastinate's recovery for it
is the stalled-job retry (``get_stalled_jobs`` finds the ``doing`` jobs of workers whose heartbeat is
older than a bound, ``retry_job`` puts them back to ``todo``), which every worker here runs before it
looks for work. The heartbeat interval and the stalled bound follow the real-time lease (120 ms), so a
worker paused past that bound is taken for dead too, as procrastinate would in production.

Every query of the worker goes through the connector, which enters the pause guard
(:mod:`killpoint.harness.libs.common`): a paused worker never sits frozen inside a transaction.

Crash points: ``before_call`` and ``after_call`` around each step's HTTP call inside the job.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import os
from typing import Any

import killpoint
from killpoint.harness.libs.common import TIMING, Downstream, PauseGuard, install_guard, order_workload

# Imported in the parent, before any fork.
import procrastinate  # noqa: E402
import psycopg  # noqa: E402
from procrastinate.schema import SchemaManager  # noqa: E402

POINTS = ("before_call", "after_call")
TASK = "killpoint_order"
FINAL = {"succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled", "aborted": "cancelled",
         "doing": "running", "todo": "pending"}
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
    import time

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
    ttl_s = TIMING.lease_ttl_ms / 1000.0
    poll_s = max(TIMING.poll_ms, 5.0) / 1000.0

    async def main() -> None:
        async with app.open_async():  # the connector is ours in this process
            manager = app.job_manager
            while True:
                jobs = list(await manager.list_jobs_async(queue=queue))
                if jobs and all(j.status not in ("todo", "doing") for j in jobs):
                    return
                # procrastinate's recovery: the doing jobs of workers whose heartbeat stopped, retried.
                for job in await manager.get_stalled_jobs(queue=queue, seconds_since_heartbeat=ttl_s):
                    try:
                        await manager.retry_job(job)
                    except procrastinate.exceptions.ConnectorException as exc:
                        if not _retried_already(exc):
                            raise
                await app.run_worker_async(queues=[queue], name=ctx.worker_id, concurrency=1, wait=False,
                                           fetch_job_polling_interval=poll_s, listen_notify=False,
                                           install_signal_handlers=False, delete_jobs="never",
                                           update_heartbeat_interval=ttl_s / 4, stalled_worker_timeout=ttl_s)
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
        raise killpoint.InvalidTarget("procrastinate needs PostgreSQL: run with --store postgresql://... "
                                      "or set KILLPOINT_PG_DSN")
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
    atexit.register(_drop_schema, conninfo, schema, os.getpid())
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


def teardown(run: killpoint.TargetRun) -> None:
    if "queue" in run.state:
        _query(run, "DELETE FROM procrastinate_jobs WHERE queue_name = %s RETURNING id", run.state["queue"])


def _declare(variant: str) -> killpoint.Target:
    keyed = variant == "keyed"

    def body(ctx: killpoint.WorkerContext) -> None:
        _work(ctx, keyed)

    return killpoint.Target(body, name=f"procrastinate:{variant}", points=POINTS, owns_state=True,
                            workload="killpoint.harness.libs.common:order_workload", setup=setup, done=done,
                            final_states=final_states, teardown=teardown)


naive = _declare("naive")
keyed = _declare("keyed")
TARGETS = {"naive": naive, "keyed": keyed}


def target_named(variant: str) -> killpoint.Target:
    try:
        return TARGETS[variant]
    except KeyError:
        raise killpoint.InvalidTarget(f"unknown procrastinate target {variant!r}: known are "
                                      f"{', '.join('procrastinate:' + v for v in TARGETS)}") from None


__all__ = ["POINTS", "final_states", "keyed", "naive", "order_workload", "target_named"]
