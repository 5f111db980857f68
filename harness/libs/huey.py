"""Huey as a target: the order as Huey tasks on a real Redis, run by Huey's own worker loop.

``huey:naive`` and ``huey:keyed``. Each step of the order is one task of :func:`step`; the first
step's task is enqueued at setup, and each task enqueues the next step's once its call succeeded.
Every key of the run carries its namespace: Huey's queue, schedule and result hash (their keys set
on the run's Huey instance; Huey's own ``huey.redis.<name>`` would strip the namespace's dashes) and
the reaper's keys (see :mod:`killpoint.harness.libs.brokers`).

**Huey runs a task at most once.** Its Redis storage takes a task off the queue with RPOP: there is
no acknowledgement, no visibility timeout and no redelivery, and ``SIGNAL_INTERRUPTED`` is sent only
when the consumer shuts down on a signal it can catch. A worker killed or lost inside a task loses
the task, and the order never finishes. So both targets carry what a Huey user who needs the task
done must write beside it, a **reaper** built of Huey's own parts (:func:`reap`, run in every
worker's loop): a step that is due (the first, or the one after a step that succeeded), has no
success in Huey's result store, is in no worker's hands (its lease key, set when Huey starts the
task, expired) and is not queued (nor enqueued in the last :data:`LEASE_S`) is enqueued again.
It makes Huey at least once, like the other queues, and opens the same door: a task whose worker
froze past the lease runs again while the first is still in it.

``naive``  a new idempotency key per execution: a task the reaper enqueued again after its effect
           applies it twice.
``keyed``  the key ``<instance>:<step>:<resource>``, the same on every execution, and a guard: a
           step Huey's result store already holds a success for is not called again.

Each killpoint worker process runs Huey's own ``Worker.loop`` (dequeue, execute, results, retries)
with the scheduler's ``read_schedule`` and the reaper between iterations. Crash points: ``started``
(Huey's pre-execute hook: the task is off the queue and its lease taken), ``before_call`` and
``after_call`` in the task, ``finished`` (Huey's post-execute hook: the result stored).
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import killpoint
from killpoint.harness.libs import brokers
from killpoint.harness.libs.common import Downstream, named_target, order_workload, queue_targets

# Imported in the parent, before any fork.
import huey  # noqa: E402
from huey import RedisHuey  # noqa: E402
from huey.consumer import Worker  # noqa: E402
from huey.utils import Error  # noqa: E402

POINTS = ("started", "before_call", "after_call", "finished")
LEASE_S = 0.3  # a started task's lease, and an enqueued one's grace, in Redis's real time
POLL_S = 0.01
RETRIES = 3  # as Huey's documentation writes a task that may fail: retries=N

logging.getLogger("huey").setLevel(logging.CRITICAL)

_worker: dict[str, Any] = {}  # this worker process's own


# -- keys and the Huey instance of a run ------------------------------------------------------------


def _task_prefix(state: dict[str, Any], instance: str, step: str) -> str:
    return f"{state['space']}|{instance}|{step}|"


def _lease_key(state: dict[str, Any], instance: str, step: str) -> str:
    return f"{brokers.redis_prefix(state['space'])}lease:{instance}:{step}"


def _grace_key(state: dict[str, Any], instance: str, step: str) -> str:
    return f"{brokers.redis_prefix(state['space'])}enqueued:{instance}:{step}"


def _huey(state: dict[str, Any]) -> tuple[Any, Any]:
    """This process's Huey instance for the run and its task: made once per process and run."""
    made = _worker.get("huey")
    if made is not None and made[0] is state:
        return made[1], made[2]
    client = brokers.redis_client(state["backend"])
    app = RedisHuey(state["name"], results=True, blocking=False, connection_pool=client.connection_pool)
    # Huey strips a name to [a-z0-9] in its keys; the run's keys must carry its namespace as it is.
    prefix = brokers.redis_prefix(state["space"])
    app.storage.queue_key, app.storage.schedule_key, app.storage.result_key = (
        f"{prefix}huey.queue", f"{prefix}huey.schedule", f"{prefix}huey.results")
    task = app.task(retries=RETRIES)(step)
    app.pre_execute()(_started)
    app.post_execute()(_finished)
    _worker["huey"] = (state, app, task)
    return app, task


def _enqueue(state: dict[str, Any], instance: str, step_name: str, *, only_once: bool = False) -> bool:
    """One task of ``step_name``, under a task id naming its step, and its grace before a reap.

    ``only_once``: not if another process set the step's grace first (two reapers that saw the same
    lost step enqueue it once between them)."""
    app, task = _huey(state)
    graced = brokers.redis_client(state["backend"]).set(_grace_key(state, instance, step_name), 1,
                                                        px=int(LEASE_S * 1000), nx=only_once)
    if not graced:
        return False
    app.enqueue(task.task_class((instance, step_name), {},
                                id=f"{_task_prefix(state, instance, step_name)}{uuid.uuid4().hex[:12]}"))
    return True


# -- the task and Huey's hooks, in a worker ---------------------------------------------------------


def step(instance: str, step_name: str) -> dict[str, Any]:
    """One step of the order: one call to the downstream, then the next step enqueued."""
    ctx = _worker["ctx"]
    state = ctx.run.state
    inst = ctx.workload.instance(instance)
    spec = inst.step(step_name)
    if state["keyed"] and _succeeded(state).get((instance, step_name)):
        body: dict[str, Any] = {"replay": True}  # the guard: Huey's result store holds its success
        status = 200
    else:
        key = f"{instance}:{step_name}:{spec.resource}" if state["keyed"] else uuid.uuid4().hex
        with ctx.at(instance, step_name):
            ctx.point("before_call")
            status, body = _worker["http"].post_step(spec, key, instance, step_name)
            ctx.point("after_call")
        if status >= 300:
            raise RuntimeError(f"{spec.resource} answered {status}: {body}")
    names = [s.name for s in inst.steps]
    if names.index(step_name) + 1 < len(names):
        _enqueue(state, instance, names[names.index(step_name) + 1])
    return {"status": status, "effect": body.get("effect_id"), "replay": bool(body.get("replay")),
            "worker": ctx.worker_id}


def _where(task: Any) -> tuple[str, str] | None:
    state = _worker["ctx"].run.state
    args = tuple(task.args)
    if len(args) == 2 and str(task.id).startswith(_task_prefix(state, *args)):
        return args[0], args[1]
    return None


def _started(task: Any) -> None:
    where = _where(task)
    if where is None:
        return
    ctx = _worker["ctx"]
    brokers.redis_client(ctx.run.state["backend"]).set(_lease_key(ctx.run.state, *where), ctx.worker_id,
                                                       px=int(LEASE_S * 1000))
    with ctx.at(*where):
        ctx.point("started")


def _finished(task: Any, value: Any, exception: BaseException | None) -> None:
    where = _where(task)
    if where is None:
        return
    ctx = _worker["ctx"]
    with ctx.at(*where):
        ctx.point("finished")
    brokers.redis_client(ctx.run.state["backend"]).delete(_lease_key(ctx.run.state, *where))


def reap(state: dict[str, Any], workload: Any) -> None:
    """Enqueue again each due step that has no success, no live lease, no grace and no queued task.

    The holds (leases, graces) and the queue are read before the results: a worker stores a step's
    success before it lets the step's lease go, so a step whose lease was gone when read shows its
    success in results read after. Read the other way round, a step that finished in between looked
    lost, and ran again."""
    steps = [(inst.id, spec.name) for inst in workload.instances for spec in inst.steps]
    client = brokers.redis_client(state["backend"])
    held = client.mget([k for i, s in steps for k in (_lease_key(state, i, s), _grace_key(state, i, s))])
    queued = _queued(state)
    succeeded = _succeeded(state)
    before_done: dict[str, bool] = {}  # instance -> every step before this one succeeded
    for n, (instance, step_name) in enumerate(steps):
        done = bool(succeeded.get((instance, step_name)))
        if before_done.get(instance, True) and not done and held[2 * n] is None and held[2 * n + 1] is None \
                and (instance, step_name) not in queued:
            _enqueue(state, instance, step_name, only_once=True)
        before_done[instance] = done


def _work(ctx: Any) -> None:
    state = ctx.run.state
    _worker.update(ctx=ctx, http=Downstream(ctx.downstream_url, ctx.worker_id))
    app, _ = _huey(state)
    worker = Worker(app, default_delay=POLL_S, max_delay=POLL_S, backoff=1)
    while not _done(state):
        for task in app.read_schedule():  # the scheduler's part: retries with a delay
            app.enqueue(task)
        reap(state, ctx.workload)
        worker.loop()


# -- the run's state, read in the harness and in workers -------------------------------------------


def _results(state: dict[str, Any]) -> dict[tuple[str, str], list[Any]]:
    """What Huey's result store holds per step: every execution's stored value or error."""
    app, _ = _huey(state)
    out: dict[tuple[str, str], list[Any]] = {}
    for field, raw in app.storage.conn.hgetall(app.storage.result_key).items():
        parts = field.decode().split("|")
        if len(parts) == 4 and parts[0] == state["space"]:
            out.setdefault((parts[1], parts[2]), []).append(app.serializer.deserialize(raw))
    return out


def _succeeded(state: dict[str, Any]) -> dict[tuple[str, str], bool]:
    return {where: any(not isinstance(v, Error) for v in values)
            for where, values in _results(state).items()}


def _queued(state: dict[str, Any]) -> set[tuple[str, str]]:
    app, _ = _huey(state)
    out = set()
    for raw in app.storage.enqueued_items():
        try:
            task = app.deserialize_task(raw)
        except Exception:  # noqa: BLE001 - not a task of this run's
            continue
        if len(task.args) == 2:
            out.add((task.args[0], task.args[1]))
    return out


def _done(state: dict[str, Any]) -> bool:
    """Every step has a success in Huey's result store, and nothing is queued or scheduled."""
    succeeded = _succeeded(state)
    if not all(succeeded.get(tuple(where)) for where in state["steps"]):
        return False
    app, _ = _huey(state)
    return not app.storage.queue_size() and not app.storage.schedule_size()


# -- in the harness -------------------------------------------------------------------------------


def setup(run: killpoint.TargetRun, *, keyed: bool) -> None:
    url = brokers.require_redis()
    state = run.state
    state.update(keyed=keyed, backend=url, space=run.namespace, name="killpoint")
    state["steps"] = [(inst.id, spec.name) for inst in run.workload.instances for spec in inst.steps]
    brokers.remember(run.namespace, url)
    for inst in run.workload.instances:
        _enqueue(state, inst.id, inst.steps[0].name)


def done(run: killpoint.TargetRun) -> bool:
    return _done(run.state)


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    results = _results(run.state)
    out = {}
    for where in map(tuple, run.state["steps"]):
        values = results.get(where, [])
        if any(not isinstance(v, Error) for v in values):
            out[where] = "succeeded"
        else:
            out[where] = "failed" if len(values) > RETRIES else "pending"
    return out


def teardown(run: killpoint.TargetRun) -> None:
    if "space" in run.state:
        brokers.purge(run.state["space"], redis=run.state["backend"])


TARGETS = queue_targets("huey", POINTS, lambda ctx: _work(ctx), setup, done=done, final_states=final_states,
                        teardown=teardown)


def target_named(variant: str) -> killpoint.Target:
    return named_target("huey", TARGETS, variant)  # type: ignore[no-any-return]


__all__ = ["POINTS", "final_states", "huey", "order_workload", "reap", "step", "target_named"]
