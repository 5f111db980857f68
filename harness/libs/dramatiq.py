"""Dramatiq as a target: the order as a Dramatiq pipeline of messages, run by Dramatiq's own worker.

``dramatiq:naive`` and ``dramatiq:keyed`` run on a Redis broker whose namespace is the run's (every
key of the run starts with it; see :mod:`killpoint.harness.libs.brokers`). Each step of the order is
one message to the actor ``killpoint_step(instance, step)``, and the order is a pipeline of them:
Dramatiq enqueues the next message once the one before was processed, under a message id fixed when
the pipeline was made, so every step's id is known in advance. Results go to Dramatiq's Redis result
backend (``store_results=True``).

Each killpoint worker process runs Dramatiq's ``Worker`` (one worker thread) on its own broker
instance. Dramatiq acknowledges a message after the actor returned; a message whose worker stopped
heartbeating (killed, or frozen) for :data:`HEARTBEAT_MS` is put back on its queue by another
worker's queue maintenance, which here runs on every fetch (``maintenance_chance`` a million in a
million; Dramatiq's default is one in a thousand). Times are Redis's and the workers' real time.

``naive``  a new idempotency key per execution: a message delivered again after its effect applies
           it twice.
``keyed``  the key ``<instance>:<step>:<resource>``, and a guard: a message whose result the backend
           already holds returns it without running again.

Crash points: ``prerun`` (``before_process_message``), ``before_call`` and ``after_call`` in the actor,
``stored`` (``after_process_message``: the result stored and the next message enqueued, not yet
acknowledged), ``acked`` (``after_ack``).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import killpoint
from killpoint.harness.libs import brokers
from killpoint.harness.libs.common import Downstream, named_target, order_workload, queue_targets

# Imported in the parent, before any fork.
import dramatiq  # noqa: E402
from dramatiq.brokers.redis import RedisBroker  # noqa: E402
from dramatiq.middleware import CurrentMessage, Middleware  # noqa: E402
from dramatiq.results import Results, ResultMissing  # noqa: E402
from dramatiq.results.backends.redis import RedisBackend  # noqa: E402

POINTS = ("prerun", "before_call", "after_call", "stored", "acked")
ACTOR = "killpoint_step"
HEARTBEAT_MS = 300  # a worker silent this long is taken for dead and its messages requeued
POLL_MS = 20  # a worker's fetch timeout: how often it asks for work (and heartbeats) when idle
DONE_POLL_S = 0.02
STATES = {True: "succeeded", False: "pending"}

logging.getLogger("dramatiq").setLevel(logging.CRITICAL)

_worker: dict[str, Any] = {}  # this worker process's own


class Points(Middleware):  # type: ignore[misc]
    """Dramatiq's own moments as crash points of the message's step."""

    def before_process_message(self, broker: Any, message: Any) -> None:
        _point_for(message, "prerun")

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                              exception: Any = None) -> None:
        if exception is None:
            _point_for(message, "stored")

    def after_ack(self, broker: Any, message: Any) -> None:
        _point_for(message, "acked")


def _point_for(message: Any, name: str) -> None:
    ctx = _worker.get("ctx")
    if ctx is None or message.actor_name != ACTOR:
        return
    instance, step = message.args[:2]
    with ctx.at(instance, step):
        ctx.point(name)


def make_broker(state: dict[str, Any], *, client: Any = None) -> tuple[Any, Any, Any]:
    """The run's broker, its result backend and the order's actor."""
    client = client if client is not None else brokers.redis_client(state["backend"])
    broker = RedisBroker(client=client, namespace=state["namespace"], heartbeat_timeout=HEARTBEAT_MS,
                         maintenance_chance=1_000_000)
    backend = RedisBackend(client=client, namespace=f"{state['namespace']}:results", use_namespace_prefix_keys=True)
    broker.add_middleware(Results(backend=backend))
    broker.add_middleware(CurrentMessage())
    broker.add_middleware(Points())
    keyed = state["keyed"]

    def step(instance: str, step: str) -> dict[str, Any]:
        return _step(instance, step, keyed)

    actor = dramatiq.actor(step, actor_name=ACTOR, queue_name=state["queue"], broker=broker, store_results=True,
                           max_retries=3)
    return broker, backend, actor


def _step(instance: str, step: str, keyed: bool) -> dict[str, Any]:
    ctx = _worker["ctx"]
    spec = ctx.workload.instance(instance).step(step)
    with ctx.at(instance, step):
        if keyed:
            message = CurrentMessage.get_current_message()
            try:
                return dict(_worker["backend"].get_result(message), guarded=True)  # delivered again
            except ResultMissing:
                pass
            key = f"{instance}:{step}:{spec.resource}"
        else:
            key = uuid.uuid4().hex
        ctx.point("before_call")
        status, body = _worker["http"].post_step(spec, key, instance, step)
        ctx.point("after_call")
    if status >= 300:
        raise RuntimeError(f"{spec.resource} answered {status}: {body}")
    return {"status": status, "effect": body.get("effect_id"), "replay": bool(body.get("replay")),
            "worker": ctx.worker_id}



# -- in a worker ----------------------------------------------------------------------------------


def _work(ctx: Any) -> None:
    state = ctx.run.state
    _worker.update(ctx=ctx, http=Downstream(ctx.downstream_url, ctx.worker_id))
    if _done(state):
        return
    broker, backend, _ = make_broker(state)
    _worker["backend"] = backend
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=POLL_MS)
    worker.start()
    try:
        while not _done(state):
            time.sleep(DONE_POLL_S)
    finally:
        worker.stop(timeout=10_000)


# -- the run's state, read in the harness and in workers -------------------------------------------


def _results(state: dict[str, Any]) -> dict[str, bool]:
    client = brokers.redis_client(state["backend"])
    keys = [f"{state['namespace']}:results:{state['queue']}:{ACTOR}:{mid}" for mid in state["tasks"]]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.exists(key)  # Dramatiq keeps a result as a one-element list (a waiter pops it)
    return {mid: bool(n) for mid, n in zip(state["tasks"], pipe.execute())}


def _done(state: dict[str, Any]) -> bool:
    """Every step has its result and no message is left unacknowledged (Dramatiq keeps each message
    in ``<queue>.msgs`` until it is acknowledged)."""
    if not all(_results(state).values()):
        return False
    return not brokers.redis_client(state["backend"]).hlen(f"{state['namespace']}:{state['queue']}.msgs")


# -- in the harness -------------------------------------------------------------------------------


def setup(run: killpoint.TargetRun, *, keyed: bool) -> None:
    url = brokers.require_redis()
    ns = brokers.redis_prefix(run.namespace).rstrip(":")
    state = run.state
    state.update(keyed=keyed, backend=url, namespace=ns, queue="orders", space=run.namespace)
    brokers.remember(run.namespace, url)
    broker, _, actor = make_broker(state)
    tasks: dict[str, tuple[str, str]] = {}
    for inst in run.workload.instances:
        messages = [actor.message_with_options(args=(inst.id, spec.name), pipe_ignore=True) for spec in inst.steps]
        for spec, message in zip(inst.steps, messages):
            tasks[message.message_id] = (inst.id, spec.name)
        dramatiq.pipeline(messages, broker=broker).run()
    state["tasks"] = tasks


def done(run: killpoint.TargetRun) -> bool:
    return _done(run.state)


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    results = _results(run.state)
    return {(inst, step): STATES[results.get(mid, False)] for mid, (inst, step) in run.state["tasks"].items()}


def teardown(run: killpoint.TargetRun) -> None:
    if "space" in run.state:
        brokers.purge(run.state["space"], redis=run.state["backend"])


TARGETS = queue_targets("dramatiq", POINTS, lambda ctx: _work(ctx), setup, done=done, final_states=final_states,
                        teardown=teardown)


def target_named(variant: str) -> killpoint.Target:
    return named_target("dramatiq", TARGETS, variant)  # type: ignore[no-any-return]


__all__ = ["POINTS", "final_states", "make_broker", "order_workload", "target_named"]
