"""RQ as a target: the order as RQ jobs on a real Redis, run by RQ's own worker.

``rq:naive`` and ``rq:keyed``. Each step of the order is one job of :func:`step_job` under a job id
fixed in advance (``<namespace>-<instance>-<step>``), each step's job depending on the one before
(``depends_on``: RQ enqueues it once that one finished), each with ``Retry(max=3)`` as RQ's
documentation writes a job that must survive a worker's death. The queue's name and every job id
carry the run's namespace (see :mod:`killpoint.harness.libs.brokers`).

Each killpoint worker process runs RQ's ``SimpleWorker`` (jobs in the worker's own process) in burst
passes, and between passes RQ's registry maintenance (``rq.registry.clean_registries`` under the
queue's maintenance lock, as RQ's worker runs it every ``maintenance_interval``, 10 minutes by
default). RQ's recovery of a dead or frozen
worker's job is there: an execution whose heartbeat expired is abandoned, and a job with retries
left is enqueued again. RQ makes that expiry the job monitoring interval plus 60 s; here the
worker's ``get_heartbeat_ttl`` gives :data:`HEARTBEAT_TTL_S`, whole seconds of Redis's real time
(RQ's unit).

``naive``  a new idempotency key per execution: a job enqueued again after its effect applies it
           twice.
``keyed``  the key ``<instance>:<step>:<resource>``, the same on every execution.

Crash points: ``started`` (RQ recorded the job as started, in its started registry), ``before_call`` and ``after_call``
in the job, ``finished`` (RQ recorded the success and enqueued the dependent job).

``history()`` is RQ's own record of each job (:func:`read_history`): its hash's creation time, its
results stream (one entry per outcome, naming its execution, the worker, the execution's start and
end) and the executions its registry still holds, mapped onto store events by
:func:`killpoint.harness.libs.queue_history.rq_events`; ``final_states()`` comes from the same events.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Mapping

import killpoint
from killpoint.harness.libs import brokers
from killpoint.harness.libs import queue_history
from killpoint.harness.libs.common import Downstream, named_target, order_workload, queue_targets

# Imported in the parent, before any fork.
import rq  # noqa: E402
from rq import Queue, Retry, SimpleWorker  # noqa: E402
from rq.executions import Execution, ExecutionRegistry  # noqa: E402
from rq.job import Job  # noqa: E402
from rq.registry import clean_registries  # noqa: E402
from rq.results import Result  # noqa: E402
from rq.utils import current_timestamp, utcparse  # noqa: E402

POINTS = ("started", "before_call", "after_call", "finished")
HEARTBEAT_TTL_S = 2  # RQ scores in whole seconds: an execution expires 1 to 2 s after its last heartbeat
POLL_S = 0.02
GLOBAL_SETS = ("rq:queues", "rq:workers")

logging.getLogger("rq").setLevel(logging.CRITICAL)

_worker: dict[str, Any] = {}  # this worker process's own


def step_job(instance: str, step: str) -> dict[str, Any]:
    """One step of the order: one call to the downstream."""
    ctx = _worker["ctx"]
    spec = ctx.workload.instance(instance).step(step)
    key = f"{instance}:{step}:{spec.resource}" if ctx.run.state["keyed"] else uuid.uuid4().hex
    with ctx.at(instance, step):
        ctx.point("before_call")
        status, body = _worker["http"].post_step(spec, key, instance, step)
        ctx.point("after_call")
    if status >= 300:
        raise RuntimeError(f"{spec.resource} answered {status}: {body}")
    return {"status": status, "effect": body.get("effect_id"), "replay": bool(body.get("replay")),
            "worker": ctx.worker_id}



class Worker(SimpleWorker):  # type: ignore[misc]
    """RQ's SimpleWorker, with a short heartbeat expiry and the job's moments as crash points."""

    def get_heartbeat_ttl(self, job: Any, working_time: float = 0.0) -> int:
        return HEARTBEAT_TTL_S

    def prepare_job_execution(self, job: Any, remove_from_intermediate_queue: bool = False) -> None:
        super().prepare_job_execution(job, remove_from_intermediate_queue)
        _point_for(job, "started")

    def handle_job_success(self, job: Any, queue: Any, started_job_registry: Any, execution: Any) -> None:
        super().handle_job_success(job, queue, started_job_registry, execution)
        _point_for(job, "finished")


def _point_for(job: Any, name: str) -> None:
    ctx = _worker.get("ctx")
    where = None if ctx is None else ctx.run.state["tasks"].get(job.id)
    if ctx is not None and where is not None:
        with ctx.at(*where):
            ctx.point(name)


# -- in a worker ----------------------------------------------------------------------------------


def _work(ctx: Any) -> None:
    state = ctx.run.state
    _worker.update(ctx=ctx, http=Downstream(ctx.downstream_url, ctx.worker_id))
    client = brokers.redis_client(state["backend"])
    queue = Queue(state["queue"], connection=client)
    worker = Worker([queue], connection=client, name=f"{state['space']}-{ctx.worker_id}")
    while not _done(state):
        maintain(queue)
        worker.work(burst=True, logging_level="CRITICAL")
        time.sleep(POLL_S)


def maintain(queue: Any) -> None:
    """RQ's registry maintenance (abandoned executions retried), under the queue's maintenance lock
    as RQ's worker runs it (``Worker.clean_registries``): two workers cleaning at once can both see
    one expired execution and both retry its job, which is then queued twice, and RQ runs it again
    after it finished (RQ's record showed it: an execution started after the job's success)."""
    if queue.acquire_maintenance_lock():
        try:
            clean_registries(queue)
        finally:
            queue.release_maintenance_lock()


# -- the run's state, read in the harness and in workers -------------------------------------------


def _statuses(state: dict[str, Any]) -> dict[str, str | None]:
    client = brokers.redis_client(state["backend"])
    pipe = client.pipeline(transaction=False)
    for job_id in state["tasks"]:
        pipe.hget(f"rq:job:{job_id}", "status")
    return {job_id: (s.decode() if s is not None else None) for job_id, s in zip(state["tasks"], pipe.execute())}


def _done(state: dict[str, Any]) -> bool:
    """Every step's job finished (RQ records it with the result, in one transaction)."""
    return all(s in ("finished", "failed") for s in _statuses(state).values())


# -- in the harness -------------------------------------------------------------------------------


def setup(run: killpoint.TargetRun, *, keyed: bool) -> None:
    url = brokers.require_redis()
    state = run.state
    state.update(keyed=keyed, backend=url, space=run.namespace, queue=f"kp-{run.namespace}")
    state["tasks"] = {f"{run.namespace}-{inst.id}-{spec.name}": (inst.id, spec.name)
                      for inst in run.workload.instances for spec in inst.steps}
    brokers.remember(run.namespace, url)
    queue = Queue(state["queue"], connection=brokers.redis_client(url))
    for inst in run.workload.instances:
        before = None
        for spec in inst.steps:
            before = queue.enqueue(step_job, inst.id, spec.name, job_id=f"{run.namespace}-{inst.id}-{spec.name}",
                                   retry=Retry(max=3), depends_on=before, result_ttl=-1)


def done(run: killpoint.TargetRun) -> bool:
    return _done(run.state)


def read_history(client: Any, tasks: Mapping[str, tuple[str, str]], space: str) -> list[dict[str, Any]]:
    """RQ's record of each job of ``tasks`` (job id -> its instance and step) as store events: its
    hash's ``created_at``, its results stream, and the executions its registry still holds that no
    result names (with their hash while it lives); ``space`` is the prefix of the run's worker names.
    Two round trips to Redis, the second only when the registry holds such an execution."""
    ids = list(tasks)
    pipe = client.pipeline(transaction=False)
    held_after = current_timestamp()  # RQ drops a registry entry once its score has passed
    for job_id in ids:
        pipe.hmget(Job.key_for(job_id), "created_at", "enqueued_at")
        pipe.xrange(Result.get_key(job_id))
        pipe.zrangebyscore(ExecutionRegistry(job_id=job_id, connection=client).key, f"({held_after}", "+inf")
    raw = pipe.execute()
    records = []
    unnamed: list[tuple[str, str]] = []
    for n, job_id in enumerate(ids):
        (created, enqueued), stream, held = raw[3 * n:3 * n + 3]
        results = [_result(entry_id, fields) for entry_id, fields in stream]
        named = {r["execution"] for r in results}
        unnamed += [(job_id, eid.decode()) for eid in held if eid.decode() not in named]
        records.append((job_id, _epoch(created), _epoch(enqueued), results))
    hashes: dict[tuple[str, str], dict[bytes, bytes]] = {}
    if unnamed:
        pipe = client.pipeline(transaction=False)
        for job_id, eid in unnamed:
            pipe.hgetall(Execution(id=eid, job_id=job_id, connection=client).key)
        hashes = dict(zip(unnamed, pipe.execute()))
    prefix = f"{space}-"

    def worker_of(name: str) -> str:
        return name[len(prefix):] if name.startswith(prefix) else name

    offset_ns = time.time_ns() - time.monotonic_ns()
    rows: list[dict[str, Any]] = []
    for job_id, created, enqueued, results in records:
        instance, step = tasks[job_id]
        opened = [{"id": eid, "worker": (h.get(b"worker_name") or b"").decode() or None,
                   "started": float(h[b"created_at"]) if b"created_at" in h else None}
                  for (j, eid), h in hashes.items() if j == job_id]
        rows += [dict(row, job_id=job_id) for row in queue_history.rq_events(
            instance, step, created_at=created, enqueued_at=enqueued, results=results, open_executions=opened,
            worker_of=worker_of, offset_ns=offset_ns)]
    return rows


def _epoch(raw: bytes | None) -> float | None:
    return None if not raw else utcparse(raw.decode()).timestamp()


def _result(entry_id: bytes, fields: Mapping[bytes, bytes]) -> dict[str, Any]:
    """One entry of a job's results stream, as :func:`queue_history.rq_events` takes it (its return
    value is not read)."""
    def text(name: bytes) -> str | None:
        value = fields.get(name)
        return value.decode() if value else None

    started, ended = text(b"execution_started_at"), text(b"execution_ended_at")
    return {"id": entry_id.decode(), "type": int(fields[b"type"]), "worker": text(b"worker_name"),
            "execution": text(b"execution_id"), "started": None if started is None else float(started),
            "ended": None if ended is None else float(ended)}


def history(run: killpoint.TargetRun) -> list[dict[str, Any]]:
    state = run.state
    return read_history(brokers.redis_client(state["backend"]), state["tasks"], state["space"])


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    """Where each job's record leaves its step: from the same events as history()."""
    return queue_history.final_states_of(history(run), run.state["tasks"].values())


def teardown(run: killpoint.TargetRun) -> None:
    if "space" in run.state:
        brokers.purge(run.state["space"], GLOBAL_SETS, redis=run.state["backend"])


TARGETS = queue_targets("rq", POINTS, lambda ctx: _work(ctx), setup, done=done, final_states=final_states,
                        history=history, teardown=teardown)


def target_named(variant: str) -> killpoint.Target:
    from killpoint.harness.libs import apps

    if variant not in TARGETS and apps.is_app(variant):  # the user's own jobs: rq:pkg.jobs:place_order
        from killpoint.harness.libs import rq_app

        return rq_app.target_for(variant)
    return named_target("rq", TARGETS, variant)  # type: ignore[no-any-return]


__all__ = ["POINTS", "final_states", "history", "order_workload", "read_history", "rq", "step_job", "target_named"]
