"""A user's own Celery app as a target: ``celery:PKG.MODULE:NAME``, run by Celery's worker as it is.

``NAME`` is the app's function that returns one order's canvas given the order id (a chain of its
tasks, a group, a chord, or one task's signature), or a task (the order is then that task alone,
``task.si(order_id)``). A canvas is data: killpoint reads the order's tasks from it, each a step
named by its function (``shop.tasks.charge_card`` -> ``charge_card``), fixes each task's id
(``<namespace>-<order>-<step>``) and sends it itself. The app is the one its tasks belong to.

The broker is imposed on the app, not edited into it: in the harness before the order is sent (and
so in the workers forked after), ``app.conf`` gets the run's Redis as broker (``broker_url``, its
read and write URLs) with the run's key prefix (kombu's ``global_keyprefix``: every queue, the
unacknowledged messages, the bindings) and, when the app has a result backend, the run's Redis as
result backend under the same prefix. The visibility timeout is shortened to
:data:`~killpoint.harness.libs.celery.VISIBILITY_S` (real time, which a run cannot wait an hour of).
Nothing that decides how a task is delivered is changed: ``acks_late``, ``acks_on_failure_or_timeout``,
``reject_on_worker_lost``, the prefetch multiplier, retries, routes and queue names stay the app's,
since a bug there is what the run is for. The harness puts the app's settings back at teardown.

Each killpoint worker process runs Celery's worker (``WorkController``, the solo pool) on the queues
the order's tasks are routed to. Crash points come from Celery's own signals and request: ``received``
(``task_received``), ``prerun`` (``task_prerun``), the user's own ``killpoint.point(...)`` calls in
the task modules, ``stored`` (``task_success``: the result stored, the chain's next task sent, the
message not yet acknowledged), ``acked`` (the request's ``acknowledge``, a hub iteration after
Celery sends the ack). Each task's outcome (``task_success``, ``task_failure``, ``task_retry``) is
recorded under the run's prefix, whether the app keeps results or not: ``final_states`` reads it,
and each worker ends itself once every task has one and nothing is queued or unacknowledged.
"""

from __future__ import annotations

from typing import Any, Callable

import killpoint
from killpoint.chaos import points as chaos
from killpoint.errors import shown
from killpoint.harness.libs import apps, brokers
from killpoint.harness.libs.celery import STATES, VISIBILITY_S, run_worker  # imports Celery, before any fork

import celery  # noqa: E402
from celery import signals  # noqa: E402
from celery.canvas import Signature, _chain, _chord, group  # noqa: E402
from kombu.utils.imports import symbol_by_name  # noqa: E402

BEFORE = ("received", "prerun")  # Celery's points before the task's body
AFTER = ("stored", "acked")  # and after it
OUTCOMES = "killpoint-outcomes"  # the hash (under the run's prefix) of each task's last outcome
FINAL = ("SUCCESS", "FAILURE")
# kombu's Redis transport keeps a message of priority p in "<queue>\x06\x16<p>" (p > 0)
PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")

_worker: dict[str, Any] = {}  # this worker process's own
_saved: dict[str, dict[str, Any]] = {}  # namespace -> the app settings setup replaced


# -- the user's order ------------------------------------------------------------------------------


class Order:
    """The app's function that makes one order's canvas, and the app its tasks belong to."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        found = apps.load("celery", spec)
        if isinstance(found, celery.Celery):
            raise killpoint.InvalidTarget(
                f"target {shown('celery:' + spec)} is a Celery app: name the function that returns one "
                f"order's canvas given the order id (as celery:pkg.tasks:order_flow, returning "
                f"chain(reserve.si(order_id), charge.si(order_id))), or a task")
        if isinstance(found, celery.Task):
            task = found
            self.make: Callable[[str], Any] = lambda order_id: task.si(order_id)
        elif callable(found):
            self.make = found
        else:
            raise killpoint.InvalidTarget(f"target {shown('celery:' + spec)}: {type(found).__name__} is "
                                          f"not a function or a task")
        leaves = self.leaves(self.canvas(apps.ORDER_ID))
        tasks = [self.task_of(leaf) for leaf in leaves]
        owners = {id(task.app): task.app for task in tasks}
        if len(owners) != 1:
            raise killpoint.InvalidTarget(f"target {shown('celery:' + spec)}: the order's tasks belong to "
                                          f"{len(owners)} Celery apps; one order, one app")
        self.app: celery.Celery = next(iter(owners.values()))
        if self.app.conf.task_always_eager:
            raise killpoint.InvalidTarget(f"target {shown('celery:' + spec)}: the app sets "
                                          f"task_always_eager, which runs tasks where they are sent, "
                                          f"with no broker and no worker to crash")
        self.tasks = [leaf.task for leaf in leaves]
        self.steps = apps.step_names(self.tasks)
        self.points = apps.user_points(task.run for task in tasks)

    def canvas(self, order_id: str) -> Any:
        try:
            made = self.make(order_id)
        except Exception as exc:  # noqa: BLE001 - the user's function: its failure is said in one line
            raise killpoint.InvalidTarget(f"target {shown('celery:' + self.spec)}: calling it with "
                                          f"{order_id!r} raised {type(exc).__name__}: {exc}"[:400]) from None
        if not isinstance(made, Signature):
            raise killpoint.InvalidTarget(
                f"target {shown('celery:' + self.spec)} returned {type(made).__name__}, not a Celery "
                f"signature: return the order's canvas (a chain, a group, a signature) and killpoint "
                f"sends it; do not send it yourself")
        return made

    def task_of(self, leaf: Any) -> Any:
        """The task a signature of the canvas calls."""
        try:
            return leaf.type
        except Exception:  # noqa: BLE001 - celery's NotRegistered (a KeyError), or the app's own failure
            raise killpoint.InvalidTarget(f"target {shown('celery:' + self.spec)}: its canvas calls "
                                          f"{shown(leaf.task)}, a task no app has registered") from None

    def leaves(self, sig: Any) -> list[Any]:
        """The task signatures of a canvas, in the order its tasks run."""
        if isinstance(sig, _chord):
            return [leaf for t in sig.tasks for leaf in self.leaves(t)] + self.leaves(sig.body)
        if isinstance(sig, (_chain, group)):
            return [leaf for t in sig.tasks for leaf in self.leaves(t)]
        if isinstance(sig, Signature):
            return [sig]
        raise killpoint.InvalidTarget(f"target {shown('celery:' + self.spec)}: the canvas holds "
                                      f"{type(sig).__name__}, not a signature")


_orders: dict[str, Order] = {}


def order(spec: str) -> Order:
    if spec not in _orders:
        _orders[spec] = Order(spec)
    return _orders[spec]


def workload(spec: str, seed: int = 0) -> Any:
    o = order(spec)
    return apps.order_workload("celery", spec, list(zip(o.steps, o.tasks)))


# -- the broker, imposed ---------------------------------------------------------------------------


def overrides(app: celery.Celery, url: str, prefix: str) -> dict[str, Any]:
    """The settings the run imposes on the app: where its messages and results go, and the visibility
    timeout; nothing of how a task is delivered or acknowledged."""
    conf = app.conf
    out: dict[str, Any] = {
        "broker_url": url, "broker_read_url": url, "broker_write_url": url,
        "broker_transport_options": {**(conf.broker_transport_options or {}), "global_keyprefix": prefix,
                                     "visibility_timeout": VISIBILITY_S},
        "broker_connection_retry_on_startup": True,
        # the worker's own chatter, not its delivery: no remote control, events or root logger
        "worker_enable_remote_control": False, "worker_send_task_events": False,
        "worker_hijack_root_logger": False,
    }
    if conf.result_backend:
        out["result_backend"] = url
        out["result_backend_transport_options"] = {**(conf.result_backend_transport_options or {}),
                                                   "global_keyprefix": prefix}
    return out


def _forget_connections(app: celery.Celery) -> None:
    """Close what the app opened in this process (its pools, the result backend's connections and
    subscription), so that a process forked later shares no socket with it and the next run's
    settings make new ones. (Not ``app.close()``: it also takes the app out of Celery's registry.)"""
    app._pool = None  # kombu's pool, which sending made (unconnected): another process may take it
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None
    backend = app._backend
    if backend is not None:
        consumer = getattr(backend, "result_consumer", None)
        if consumer is not None and hasattr(consumer, "stop"):
            consumer.stop()
        pool = getattr(getattr(backend, "client", None), "connection_pool", None)
        if pool is not None:
            pool.disconnect()
    app._backend_cache = None
    vars(app._local).pop("backend", None)


# -- in a worker ----------------------------------------------------------------------------------


def _where(task_id: Any) -> tuple[str, str] | None:
    ctx = _worker.get("ctx")
    return None if ctx is None else ctx.run.state["tasks"].get(task_id)


def _point(task_id: Any, name: str) -> None:
    where = _where(task_id)
    if where is not None:
        with chaos.at(*where):
            _worker["ctx"].point(name)


def _record(task_id: Any, outcome: str) -> None:
    if _where(task_id) is not None:
        state = _worker["ctx"].run.state
        brokers.redis_client(state["redis"]).hset(f"{state['prefix']}{OUTCOMES}", task_id, outcome)


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    _point(request.id, "received")


def _on_prerun(sender: Any = None, task_id: Any = None, **_: Any) -> None:
    where = _where(task_id)
    if where is None:
        return
    step = chaos.at(*where)  # the task's body runs in its step: the user's points, the tagged requests
    step.__enter__()
    _worker["in_step"] = step
    _worker["ctx"].point("prerun")


def _on_postrun(sender: Any = None, task_id: Any = None, **_: Any) -> None:
    step = _worker.pop("in_step", None)
    if step is not None:
        step.__exit__(None, None, None)


def _on_success(sender: Any = None, **_: Any) -> None:
    task_id = sender.request.id
    _record(task_id, "SUCCESS")
    _point(task_id, "stored")


def _on_failure(sender: Any = None, task_id: Any = None, **_: Any) -> None:
    _record(task_id, "FAILURE")


def _on_retry(sender: Any = None, request: Any = None, **_: Any) -> None:
    _record(getattr(request, "id", None), "RETRY")


def _acked_request(base: type) -> type:
    """The task's request class with the ``acked`` point once the message is acknowledged. Celery
    sends the ack on the worker's next loop iteration (``hub.call_soon``); the point comes after it."""

    class Acked(base):  # type: ignore[misc, valid-type]
        def acknowledge(self) -> None:
            first = not self.acknowledged
            super().acknowledge()
            hub = _worker.get("hub")
            if first and hub is not None:
                task_id = self.id
                # the hub runs a batch of call_soon callbacks in no order: the point goes in the next batch
                hub.call_soon(lambda: hub.call_soon(lambda: _point(task_id, "acked")))

    Acked.__name__ = Acked.__qualname__ = f"Acked{base.__name__}"
    return Acked


def _work(ctx: Any) -> None:
    state = ctx.run.state
    apps.enter_worker(ctx)
    _worker.update(ctx=ctx)
    if _done(state):
        return
    app = order(state["spec"]).app
    for name in dict.fromkeys(order(state["spec"]).tasks):
        task = app.tasks[name]
        task.Request = _acked_request(symbol_by_name(task.Request))
    for signal, handler in ((signals.task_received, _on_received), (signals.task_prerun, _on_prerun),
                            (signals.task_postrun, _on_postrun), (signals.task_success, _on_success),
                            (signals.task_failure, _on_failure), (signals.task_retry, _on_retry)):
        signal.connect(handler, weak=False, dispatch_uid=f"killpoint-app-{handler.__name__}")
    run_worker(app, _worker, lambda: _done(state), hostname=f"{ctx.worker_id}@{state['namespace']}",
               queues=state["queues"])


# -- the run's state, read in the harness and in workers -------------------------------------------


def _outcomes(state: dict[str, Any]) -> dict[str, str]:
    raw = brokers.redis_client(state["redis"]).hgetall(f"{state['prefix']}{OUTCOMES}")
    return {k.decode(): v.decode() for k, v in raw.items()}


def _done(state: dict[str, Any]) -> bool:
    """Nothing queued or unacknowledged, and every task has its final outcome (or one failed, which
    ends its chain)."""
    client = brokers.redis_client(state["redis"])
    prefix = state["prefix"]
    pipe = client.pipeline(transaction=False)
    for queue in state["queues"]:
        for suffix in PRIORITY_SUFFIXES:
            pipe.llen(f"{prefix}{queue}{suffix}")
    pipe.hlen(f"{prefix}unacked")
    if any(pipe.execute()):
        return False
    outcomes = [_outcomes(state).get(task_id) for task_id in state["tasks"]]
    return all(o in FINAL for o in outcomes) or "FAILURE" in outcomes


# -- in the harness -------------------------------------------------------------------------------


def setup(run: killpoint.TargetRun, *, spec: str) -> None:
    url = brokers.require_redis()
    o = order(spec)
    app = o.app
    ns = run.namespace
    prefix = brokers.redis_prefix(ns)
    conf = overrides(app, url, prefix)
    _saved[ns] = {key: app.conf.get(key) for key in conf}
    run.state.update(spec=spec, redis=url, prefix=prefix, namespace=ns)
    brokers.remember(ns, url)
    tasks: dict[str, tuple[str, str]] = {}
    queues: list[str] = []
    canvases = []
    app.conf.update(conf)
    _forget_connections(app)
    for inst in run.workload.instances:
        canvas = o.canvas(inst.id)
        leaves = o.leaves(canvas)
        steps = apps.step_names(leaf.task for leaf in leaves)
        if steps != [s.name for s in inst.steps]:
            raise killpoint.InvalidTarget(f"target {shown('celery:' + spec)} made the tasks {steps} for "
                                          f"{inst.id}, not the workload's {[s.name for s in inst.steps]}")
        for leaf, step in zip(leaves, steps):
            task_id = f"{ns}-{inst.id}-{step}"
            leaf.set(task_id=task_id)
            tasks[task_id] = (inst.id, step)
            queue = app.amqp.router.route(dict(leaf.options), leaf.task, leaf.args, leaf.kwargs)["queue"].name
            if queue not in queues:
                queues.append(queue)
        canvases.append(canvas)
    run.state.update(tasks=tasks, queues=queues)
    try:
        # on a connection of its own, closed here (see celery.setup: a connection left open in the
        # harness is inherited by every process it forks later)
        with app.connection_for_write() as conn:
            for canvas in canvases:
                canvas.apply_async(connection=conn)
    finally:
        _forget_connections(app)


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    outcomes = _outcomes(run.state)
    return {where: STATES.get(outcomes.get(task_id, "PENDING"), "pending")
            for task_id, where in run.state["tasks"].items()}


def teardown(run: killpoint.TargetRun) -> None:
    ns = run.namespace
    saved = _saved.pop(ns, None)
    if saved is not None:
        app = order(run.state["spec"]).app
        app.conf.update(saved)
        _forget_connections(app)
    if "redis" in run.state:
        brokers.purge(ns, redis=run.state["redis"])


# -- the target -----------------------------------------------------------------------------------

_targets: dict[str, killpoint.Target] = {}


def target_for(spec: str) -> killpoint.Target:
    """The target ``celery:<spec>``: built once per process (the app imported, the order read)."""
    if spec not in _targets:
        o = order(spec)
        mine = tuple(p for p in o.points if p not in BEFORE + AFTER)

        def body(ctx: killpoint.WorkerContext) -> None:
            _work(ctx)

        # A worker holds its message unacknowledged from its delivery to its ack: frozen in the task,
        # it is delivered again once the visibility timeout passed.
        _targets[spec] = killpoint.Target(
            body, name=f"celery:{spec}", points=BEFORE + mine + AFTER, owns_state=True,
            workload=apps.workload_name("celery", spec), lease_points=("prerun",) + mine,
            setup=lambda run: setup(run, spec=spec), final_states=final_states, teardown=teardown)
    return _targets[spec]


__all__ = ["Order", "final_states", "order", "overrides", "setup", "target_for", "teardown", "workload"]
