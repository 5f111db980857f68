"""arq as a target: the order as arq jobs on a real Redis, run by arq's own worker.

``arq:naive`` and ``arq:keyed``. Each step of the order is one job of the function ``killpoint_step``
under a job id fixed in advance (``<namespace>-<instance>-<step>``); the first step's job is enqueued
at setup, and each job enqueues the next step's once its call succeeded (arq refuses a job id that is
queued or has a result, so a job run again enqueues nothing twice). Every key of the run carries its
namespace: the queue's name and the job ids (see :mod:`killpoint.harness.libs.brokers`).

Each killpoint worker process runs arq's ``Worker`` (its own polling, in-progress keys, retries and
results). arq runs a job at least once: a worker takes a job by setting its in-progress key with an
expiry, and a job whose key expired while it is still in the queue (its worker died or froze) is
taken again by the next worker that polls, as its next try. arq makes that expiry the job timeout
plus 10 s; here it is :data:`IN_PROGRESS_S` (the worker's ``in_progress_timeout_s``), real time, and
workers poll every :data:`POLL_S`.

``naive``  a new idempotency key per try: a job taken again after its effect applies it twice.
``keyed``  the key ``<instance>:<step>:<resource>``, the same on every try.

Crash points: ``started`` (``on_job_start``), ``before_call`` and ``after_call`` in the job,
``ended`` (``on_job_end``: the job returned, its result not yet recorded), ``finished``
(``after_job_end``: the result recorded and the job gone from the queue).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any

import killpoint
from killpoint.harness.libs import brokers
from killpoint.harness.libs.common import Downstream, named_target, order_workload, queue_targets

# Imported in the parent, before any fork.
import arq  # noqa: E402
from arq.connections import ArqRedis, RedisSettings, create_pool  # noqa: E402
from arq.constants import result_key_prefix  # noqa: E402
from arq.jobs import deserialize_result  # noqa: E402
from arq.worker import Worker, func  # noqa: E402

POINTS = ("started", "before_call", "after_call", "ended", "finished")
FUNCTION = "killpoint_step"
IN_PROGRESS_S = 0.3
POLL_S = 0.01
DONE_POLL_S = 0.02
MAX_TRIES = 5

logging.getLogger("arq").setLevel(logging.CRITICAL)

_worker: dict[str, Any] = {}  # this worker process's own


def _job_id(state: dict[str, Any], instance: str, step: str) -> str:
    return f"{state['space']}-{instance}-{step}"


async def step_job(job_ctx: dict[str, Any], instance: str, step: str) -> dict[str, Any]:
    ctx = _worker["ctx"]
    state = ctx.run.state
    inst = ctx.workload.instance(instance)
    spec = inst.step(step)
    key = f"{instance}:{step}:{spec.resource}" if state["keyed"] else uuid.uuid4().hex
    with ctx.at(instance, step):
        ctx.point("before_call")
        status, body = await asyncio.to_thread(_worker["http"].post_step, spec, key, instance, step)
        ctx.point("after_call")
    if status >= 300:
        raise RuntimeError(f"{spec.resource} answered {status}: {body}")
    names = [s.name for s in inst.steps]
    if names.index(step) + 1 < len(names):
        following = names[names.index(step) + 1]
        await job_ctx["redis"].enqueue_job(FUNCTION, instance, following, _job_id=_job_id(state, instance, following),
                                           _queue_name=state["queue"])
    return {"status": status, "effect": body.get("effect_id"), "replay": bool(body.get("replay")),
            "worker": ctx.worker_id, "try": job_ctx.get("job_try")}



def _hook(name: str) -> Any:
    async def hook(job_ctx: dict[str, Any]) -> None:
        ctx = _worker["ctx"]
        where = ctx.run.state["tasks"].get(job_ctx.get("job_id"))
        if where is not None:
            with ctx.at(*where):
                ctx.point(name)

    return hook


# -- in a worker ----------------------------------------------------------------------------------


def _work(ctx: Any) -> None:
    state = ctx.run.state
    _worker.update(ctx=ctx, http=Downstream(ctx.downstream_url, ctx.worker_id))
    if _done(state):
        return

    async def main() -> None:
        pool = await create_pool(RedisSettings.from_dsn(state["backend"]))
        worker = Worker(functions=[func(step_job, name=FUNCTION, max_tries=MAX_TRIES)], redis_pool=pool,
                        queue_name=state["queue"], poll_delay=POLL_S, handle_signals=False, keep_result_forever=True,
                        on_job_start=_hook("started"), on_job_end=_hook("ended"), after_job_end=_hook("finished"),
                        health_check_interval=3600, max_jobs=1)
        worker.in_progress_timeout_s = IN_PROGRESS_S
        running = asyncio.create_task(worker.async_run())
        # ends once the order is done and this worker runs no job (its hooks have run too)
        while running.done() or worker.job_counter or not _done(state):
            if running.done():
                running.result()  # arq's loop ended by itself: what it raised is a finding
                return
            await asyncio.sleep(DONE_POLL_S)
        running.cancel()
        try:
            await running
        except asyncio.CancelledError:
            pass
        await worker.close()

    asyncio.run(main())


# -- the run's state, read in the harness and in workers -------------------------------------------


def _results(state: dict[str, Any]) -> dict[str, Any]:
    client = brokers.redis_client(state["backend"])
    ids = list(state["tasks"])
    raw = client.mget([result_key_prefix + i for i in ids])
    return {i: deserialize_result(r) for i, r in zip(ids, raw) if r is not None}


def _done(state: dict[str, Any]) -> bool:
    """Every step's job has its result and the queue is empty."""
    results = _results(state)
    if len(results) < len(state["tasks"]):
        return False
    return not brokers.redis_client(state["backend"]).zcard(state["queue"])


# -- in the harness -------------------------------------------------------------------------------


def setup(run: killpoint.TargetRun, *, keyed: bool) -> None:
    url = brokers.require_redis()
    state = run.state
    state.update(keyed=keyed, backend=url, space=run.namespace, queue=f"{brokers.redis_prefix(run.namespace)}q")
    state["tasks"] = {_job_id(state, inst.id, spec.name): (inst.id, spec.name)
                      for inst in run.workload.instances for spec in inst.steps}
    brokers.remember(run.namespace, url)

    async def enqueue() -> None:
        pool: ArqRedis = await create_pool(RedisSettings.from_dsn(url))
        try:
            for inst in run.workload.instances:
                first = inst.steps[0].name
                await pool.enqueue_job(FUNCTION, inst.id, first, _job_id=_job_id(state, inst.id, first),
                                       _queue_name=state["queue"])
        finally:
            await pool.aclose()

    # In a thread of its own: asyncio.run in the harness's main thread would take its Ctrl-C.
    failed: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run_catching(enqueue, failed), name="killpoint-arq-enqueue")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def _run_catching(coro: Any, failed: list[BaseException]) -> None:
    try:
        asyncio.run(coro())
    except BaseException as exc:  # noqa: BLE001 - raised again in the harness's thread
        failed.append(exc)


def done(run: killpoint.TargetRun) -> bool:
    return _done(run.state)


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    results = _results(run.state)
    out = {}
    for job_id, where in run.state["tasks"].items():
        r = results.get(job_id)
        out[where] = "pending" if r is None else ("succeeded" if r.success else "failed")
    return out


def teardown(run: killpoint.TargetRun) -> None:
    if "space" in run.state:
        brokers.purge(run.state["space"], redis=run.state["backend"])


TARGETS = queue_targets("arq", POINTS, lambda ctx: _work(ctx), setup, done=done, final_states=final_states,
                        teardown=teardown)


def target_named(variant: str) -> killpoint.Target:
    return named_target("arq", TARGETS, variant)  # type: ignore[no-any-return]


__all__ = ["POINTS", "final_states", "order_workload", "target_named", "arq"]
