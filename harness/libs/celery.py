"""Celery as a target: the order as a chain of Celery tasks, run by Celery's own worker.

``celery:naive`` and ``celery:keyed`` run on a Redis broker, ``celery:naive:amqp`` and
``celery:keyed:amqp`` on RabbitMQ; the result backend is Redis in both (see
:mod:`killpoint.harness.libs.brokers` for the addresses and the per-run namespace).

Each step of the order is one task, ``killpoint.step(instance=..., step=...)``, and the order is a
chain of them (each task's id fixed when the chain is sent: ``<namespace>-<instance>-<step>``). The
tasks are written as Celery's documentation writes a task that must survive a worker's death:
``acks_late=True`` (the message is acknowledged after the task returns, so a worker that dies before
has it delivered again) with ``worker_prefetch_multiplier=1``, and on Redis a visibility timeout
(:data:`VISIBILITY_S`, real time: Redis's clock, which the run clock cannot move) after which a
message delivered and never acknowledged is delivered again. On RabbitMQ the broker requeues the
unacknowledged message when the consumer's connection closes: at once for a killed worker, after two
missed broker heartbeats (:data:`HEARTBEAT_S`) for a frozen one.

Each killpoint worker process runs Celery's worker (``WorkController``, the solo pool) under its
worker id as hostname. What recovers is Celery's own redelivery. kombu 5.5 sweeps Redis's unacked
messages back onto their queue at a worker's start and every 10 s after; a consumer bootstep here
runs the same sweep (``QoS.restore_visible``) every :data:`SWEEP_S`, what kombu 5.7's
``unacked_restore_interval`` option sets, so a frozen worker's message is delivered again while it
is frozen. The same bootstep ends the worker once the order is done (every task succeeded, nothing
left in the queue or unacknowledged).

``naive``  a new idempotency key per execution (a request id the HTTP client makes): a task
           delivered again after its effect applies it twice.
``keyed``  the key ``<instance>:<step>:<resource>``, stable across deliveries, and a guard: a task
           whose result the backend already holds as a success returns it without running again.

Crash points, each at a moment of Celery's own: ``received`` (the worker got the message:
``task_received``), ``prerun`` (the task is about to run: ``task_prerun``), ``before_call`` and
``after_call`` inside the task around the HTTP call, ``stored`` (the result is in the backend, the
message not yet acknowledged: ``task_success``), ``acked`` (the message was acknowledged: the task's
request class).
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any, Callable

import killpoint
from killpoint.harness.libs import brokers
from killpoint.harness.libs.common import Downstream, order_workload

# Imported in the parent, before any fork.
import celery  # noqa: E402
from celery import bootsteps, signals  # noqa: E402
from celery.worker.request import Request  # noqa: E402
import importlib  # noqa: E402

# What a worker imports as it builds Celery's worker (WorkController) and starts it: imported once
# here, not in every forked worker (about 30 ms of CPU a worker).
for _module in ("billiard.pool", "celery.app.amqp", "celery.app.control", "celery.app.events", "celery.app.routes",
                "celery.app.trace", "celery.backends.redis", "celery.concurrency.solo", "celery.events.dispatcher",
                "celery.events.receiver", "celery.fixups.django", "celery.loaders.app", "celery.worker.autoscale",
                "celery.worker.components", "celery.worker.consumer.consumer",
                "celery.worker.consumer.delayed_delivery",
                "celery.worker.loops", "celery.worker.pidbox", "celery.worker.strategy", "celery.worker.worker",
                "kombu.asynchronous.hub", "kombu.matcher", "kombu.mixins", "kombu.pidbox", "kombu.transport.redis",
                "kombu.transport.pyamqp"):
    importlib.import_module(_module)

POINTS = ("received", "prerun", "before_call", "after_call", "stored", "acked")
TASK = "killpoint.step"
VISIBILITY_S = 0.3  # Redis: an unacknowledged message is delivered again after this (real time)
SWEEP_S = 0.02  # how often a worker sweeps unacknowledged messages back, and asks whether it is done
HEARTBEAT_S = 1  # RabbitMQ: the broker heartbeat, whole seconds (AMQP's unit)
STATES = {"SUCCESS": "succeeded", "FAILURE": "failed", "REVOKED": "cancelled", "STARTED": "running",
          "RETRY": "retry_scheduled", "PENDING": "pending", "RECEIVED": "pending"}

for _name in ("celery", "kombu"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)

_worker: dict[str, Any] = {}  # this worker process's own


class _Finished(BaseException):
    """Raised from the worker's event loop once the order is done: the worker returns."""


# -- the app --------------------------------------------------------------------------------------


def _config(state: dict[str, Any]) -> dict[str, Any]:
    prefix, queue = state["prefix"], state["queue"]
    conf: dict[str, Any] = {
        "broker_url": state["broker"], "result_backend": state["backend"],
        "result_backend_transport_options": {"global_keyprefix": prefix},
        "result_extended": True,  # the worker is kept with each result (one per task: no history(), see the docs)
        "task_default_queue": queue, "task_default_exchange": queue, "task_default_routing_key": queue,
        "task_acks_late": True, "worker_prefetch_multiplier": 1,
        "worker_enable_remote_control": False, "worker_send_task_events": False,
        "worker_hijack_root_logger": False, "broker_connection_retry_on_startup": True,
        "result_expires": None,
    }
    if state["kind"] == "redis":
        conf["broker_transport_options"] = {"global_keyprefix": prefix, "visibility_timeout": VISIBILITY_S}
    else:
        conf["broker_heartbeat"] = HEARTBEAT_S
    return conf


def make_app(state: dict[str, Any], *, current: bool) -> celery.Celery:
    """An app on the run's broker and namespace with the order's task."""
    app = celery.Celery("killpoint", set_as_current=current)
    app.conf.update(_config(state))
    keyed = state["keyed"]

    @app.task(name=TASK, bind=True, acks_late=True, Request=AckedRequest)
    def step(self: Any, instance: str, step: str) -> dict[str, Any]:
        return _step(self, instance, step, keyed)

    return app


def _step(task: Any, instance: str, step: str, keyed: bool) -> dict[str, Any]:
    ctx = _worker["ctx"]
    spec = ctx.workload.instance(instance).step(step)
    with ctx.at(instance, step):
        if keyed:
            meta = task.backend.get_task_meta(task.request.id)
            if meta.get("status") == "SUCCESS":
                return dict(meta["result"], guarded=True)  # delivered again after it succeeded
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



class AckedRequest(Request):  # type: ignore[misc]
    """Celery's request, with the ``acked`` point once the message is acknowledged. Celery sends the
    ack on the worker's next loop iteration (``hub.call_soon``); the point comes one iteration later."""

    def acknowledge(self) -> None:
        first = not self.acknowledged
        super().acknowledge()
        hub = _worker.get("hub")
        if first and hub is not None:
            kwargs, task_id = self.kwargs, self.id
            _worker.setdefault("acked", []).append(task_id)  # out of the in-hand set by the next task
            # the hub runs a batch of call_soon callbacks in no order: the point goes in the next batch
            def beside_the_ack() -> None:
                _on_ack(task_id)
                hub.call_soon(lambda: _point_for(kwargs, "acked"))

            hub.call_soon(beside_the_ack)


def _point_for(kwargs: Any, name: str) -> None:
    ctx = _worker.get("ctx")
    if ctx is None or not isinstance(kwargs, dict) or "instance" not in kwargs:
        return
    with ctx.at(kwargs["instance"], kwargs.get("step")):
        ctx.point(name)


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    state = _worker["ctx"].run.state
    if state["kind"] == "amqp":  # RabbitMQ does not say what its consumers hold: we keep count
        key = f"{state['prefix']}in-hand"
        pipe = brokers.redis_client(state["backend"]).pipeline(transaction=False)
        # The tasks this worker acknowledged go first (their own removal waits in the hub's next
        # batch): the task received now runs before that batch, and a worker killed in it left an
        # acknowledged one in hand for ever (the run then waited out its bound). A second removal
        # of the same task, by that batch, changes nothing.
        acked = _worker.pop("acked", ())
        if acked:
            pipe.srem(key, *acked)
        pipe.sadd(key, request.id)
        pipe.execute()
    _point_for(request.kwargs, "received")


def _on_ack(task_id: str) -> None:
    """Beside the ack itself (the same batch of the hub's callbacks, no crash point between)."""
    state = _worker["ctx"].run.state
    if state["kind"] == "amqp":
        brokers.redis_client(state["backend"]).srem(f"{state['prefix']}in-hand", task_id)


def _on_prerun(sender: Any = None, kwargs: Any = None, **_: Any) -> None:
    _point_for(kwargs, "prerun")


def _on_success(sender: Any = None, **_: Any) -> None:
    _point_for(sender.request.kwargs, "stored")


def _sweep_step(worker: dict[str, Any], done: Callable[[], bool]) -> type:
    """A consumer step: every SWEEP_S, kombu's sweep of unacknowledged Redis messages (kombu 5.7's
    ``unacked_restore_interval``), and the end of the worker once ``done()`` (raising
    :class:`_Finished` from its event loop). It keeps the worker's hub in ``worker["hub"]``."""

    class Sweep(bootsteps.StartStopStep):  # type: ignore[misc]
        requires = {"celery.worker.consumer.tasks:Tasks"}

        def start(self, c: Any) -> None:
            worker["hub"] = c.controller.hub
            c.timer.call_repeatedly(SWEEP_S, self.tick, (c,), priority=10)

        @staticmethod
        def tick(c: Any) -> None:
            qos = getattr(c.task_consumer.channel, "qos", None)
            if qos is not None and hasattr(qos, "restore_visible"):
                qos.restore_visible(num=100, interval=1)
            # Done on two ticks in a row, the hub's poll between them: a message this worker's broker
            # connection already took (Redis's BRPOP answered, RabbitMQ's delivery in the socket) is in
            # no list Redis or RabbitMQ shows until the hub reads it; ending on the first tick lost it,
            # and with it the duplicate a naive task delivered again applies.
            if not done():
                worker["done_seen"] = False
            elif worker.get("done_seen"):
                raise _Finished()
            else:
                worker["done_seen"] = True

    return Sweep


def run_worker(app: celery.Celery, worker: dict[str, Any], done: Callable[[], bool], *, hostname: str,
               **options: Any) -> None:
    """Celery's own worker (the solo pool, no heartbeat, mingle or gossip) in this process, until
    ``done()`` holds on two sweeps in a row (see :func:`_sweep_step`)."""
    app.steps["consumer"].add(_sweep_step(worker, done))
    controller = app.WorkController(pool_cls="solo", concurrency=1, hostname=hostname, without_heartbeat=True,
                                    without_mingle=True, without_gossip=True, loglevel="CRITICAL", **options)
    try:
        controller.start()
    except _Finished:
        return


# -- in a worker ----------------------------------------------------------------------------------


def _work(ctx: Any) -> None:
    state = ctx.run.state
    _worker.update(ctx=ctx, http=Downstream(ctx.downstream_url, ctx.worker_id))
    if _done(state):
        return
    app = make_app(state, current=True)
    signals.task_received.connect(_on_received, weak=False, dispatch_uid="killpoint-received")
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="killpoint-prerun")
    signals.task_success.connect(_on_success, weak=False, dispatch_uid="killpoint-stored")
    run_worker(app, _worker, lambda: _done(state), hostname=f"{ctx.worker_id}@{state['namespace']}")


# -- the run's state, read in the harness and in workers -------------------------------------------


def _metas(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """task id -> its result in the backend (missing: no result yet)."""
    client = brokers.redis_client(state["backend"])
    ids = list(state["tasks"])
    raw = client.mget([f"{state['prefix']}celery-task-meta-{i}" for i in ids])
    return {i: json.loads(r) for i, r in zip(ids, raw) if r is not None}


def _done(state: dict[str, Any]) -> bool:
    """Every task succeeded and nothing is left to deliver: none queued, none unacknowledged (on
    RabbitMQ, none received and not yet acknowledged: the workers keep that set in Redis)."""
    metas = _metas(state)
    if len(metas) < len(state["tasks"]) or any(m.get("status") != "SUCCESS" for m in metas.values()):
        return False
    if state["kind"] == "redis":
        client = brokers.redis_client(state["backend"])
        prefix = state["prefix"]
        pipe = client.pipeline(transaction=False)
        pipe.llen(f"{prefix}{state['queue']}")
        pipe.hlen(f"{prefix}unacked")
        return not any(pipe.execute())
    in_hand = brokers.redis_client(state["backend"]).scard(f"{state['prefix']}in-hand")
    return not in_hand and brokers.amqp_queue_depth(state["broker"], state["queue"]) == 0


# -- in the harness -------------------------------------------------------------------------------


def setup(run: killpoint.TargetRun, *, kind: str, keyed: bool) -> None:
    backend = brokers.require_redis()
    broker = backend if kind == "redis" else brokers.require_amqp()
    ns = run.namespace
    prefix = brokers.redis_prefix(ns)
    queue = f"{prefix}q" if kind == "redis" else f"kp.{ns}"
    tasks = {f"{ns}-{inst.id}-{spec.name}": (inst.id, spec.name)
             for inst in run.workload.instances for spec in inst.steps}
    run.state.update(kind=kind, keyed=keyed, broker=broker, backend=backend, prefix=prefix, queue=queue,
                     namespace=ns, tasks=tasks)
    brokers.remember(ns, backend, broker if kind == "amqp" else None, queues=[queue], exchanges=[queue])
    app = make_app(run.state, current=False)
    task = app.tasks[TASK]
    try:
        # On a connection of its own, closed here, as the backend's: a connection left open in the
        # harness is inherited by every process it forks later (a matrix's runners), and two
        # processes reading one socket each wait for the other's answer for ever.
        with app.connection_for_write() as conn:
            for inst in run.workload.instances:
                celery.chain(*(task.si(instance=inst.id, step=spec.name).set(task_id=f"{ns}-{inst.id}-{spec.name}")
                               for spec in inst.steps)).apply_async(connection=conn)
    finally:
        app.close()
        backend = app.backend
        backend.result_consumer.stop()  # the subscription Celery opens to hear of each task's result
        backend.client.connection_pool.disconnect()


def done(run: killpoint.TargetRun) -> bool:
    """Not the target's ``done`` hook: kombu takes a message off a Redis queue (BRPOP) before it
    records it as unacknowledged, so from outside a worker the last message can be in neither place
    for a moment, and the harness would end the worker that holds it. Each worker asks from inside
    its own loop, where it holds no message, and ends itself; the run ends when they all have."""
    return _done(run.state)


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    metas = _metas(run.state)
    return {(inst, step): STATES.get(metas.get(tid, {}).get("status", "PENDING"), "pending")
            for tid, (inst, step) in run.state["tasks"].items()}


def teardown(run: killpoint.TargetRun) -> None:
    if "namespace" in run.state:
        brokers.purge(run.state["namespace"], redis=run.state["backend"])


# -- the targets ----------------------------------------------------------------------------------


def _declare(variant: str) -> killpoint.Target:
    policy, _, kind = variant.partition(":")
    kind = kind or "redis"
    keyed = policy == "keyed"

    def body(ctx: killpoint.WorkerContext) -> None:
        _work(ctx)

    return killpoint.Target(body, name=f"celery:{variant}", points=POINTS, owns_state=True,
                            workload="killpoint.harness.libs.common:order_workload",
                            setup=lambda run: setup(run, kind=kind, keyed=keyed),
                            final_states=final_states, teardown=teardown)


VARIANTS = ("naive", "keyed", "naive:amqp", "keyed:amqp")
_targets: dict[str, killpoint.Target] = {}


def target_named(variant: str) -> killpoint.Target:
    from killpoint.harness.libs import apps

    if variant not in VARIANTS and apps.is_app(variant):  # the user's own app: celery:pkg.tasks:order_flow
        from killpoint.harness.libs import celery_app

        return celery_app.target_for(variant)
    if variant not in VARIANTS:
        raise killpoint.InvalidTarget(f"unknown celery target {variant!r}: known are "
                                      f"{', '.join('celery:' + v for v in VARIANTS)}, or your own app's "
                                      f"order as celery:pkg.module:function")
    if variant not in _targets:
        _targets[variant] = _declare(variant)
    return _targets[variant]


__all__ = ["POINTS", "final_states", "make_app", "order_workload", "target_named"]
