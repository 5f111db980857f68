"""A user's own RQ jobs as a target: ``rq:PKG.MODULE:NAME``, run by RQ's worker as they are.

``NAME`` is the app's function that enqueues one order on the queue it is given:
``place_order(queue, order_id)``, calling ``queue.enqueue(...)`` as the app does in production
(with its own ``Retry``, ``depends_on``, timeouts and TTLs). RQ takes its queue from the caller, so
the broker is imposed by the queue killpoint passes: the run's Redis, a queue named after the run
(``kp-<namespace>``), and each job's id made in the run's namespace (``<namespace>-<order>-<step>``,
or ``<namespace>-<id>`` when the app gives one), so that the run's keys can all be found and deleted.
The order's steps are the jobs the function enqueues, each named by its function
(``shop_jobs.charge_card`` -> ``charge_card``): killpoint learns them by calling the function once on
a queue that records what is enqueued and sends nothing.

Each killpoint worker process runs RQ's ``SimpleWorker`` (jobs in the worker's own process) in burst
passes with RQ's registry maintenance between them, as the built-in ``rq:*`` targets do (see
:mod:`killpoint.harness.libs.rq`): an execution whose heartbeat expired
(:data:`~killpoint.harness.libs.rq.HEARTBEAT_TTL_S`, RQ's whole seconds) is abandoned, and a job
with retries left is enqueued again. Crash points: ``started`` (RQ recorded the job as started), the
user's own ``killpoint.point(...)`` calls in the job modules, ``finished`` (RQ recorded the success
and enqueued the dependent jobs). ``history()`` and ``final_states()`` are RQ's own record of each
job, as for ``rq:*`` (:func:`killpoint.harness.libs.rq.read_history`).
"""

from __future__ import annotations

import importlib
import time
from typing import Any, Callable

import killpoint
from killpoint.chaos import points as chaos
from killpoint.errors import shown
from killpoint.harness.libs import apps, brokers, queue_history
from killpoint.harness.libs.rq import (GLOBAL_SETS, HEARTBEAT_TTL_S, POLL_S, maintain,  # imports RQ, before any fork
                                      read_history)

import redis  # noqa: E402
from rq import Queue, SimpleWorker  # noqa: E402

BEFORE = ("started",)
AFTER = ("finished",)
FINAL = ("finished", "failed", "stopped", "canceled")
WAITING = ("queued", "started", "scheduled")

_worker: dict[str, Any] = {}  # this worker process's own


class OrderQueue(Queue):  # type: ignore[misc]
    """The queue the user's function enqueues one order on: each job it creates gets an id in the
    run's namespace and is recorded as a step; ``dry``: nothing is sent (to learn the steps)."""

    def __init__(self, name: str, *, connection: Any, space: str, order_id: str, dry: bool = False) -> None:
        super().__init__(name, connection=connection)
        self.kp_space, self.kp_order, self.kp_dry = space, order_id, dry
        self.kp_jobs: list[tuple[str, str]] = []  # (job id, the function's name)

    def create_job(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        name = func if isinstance(func, str) else f"{func.__module__}.{func.__qualname__}"
        step = apps.step_names([*(n for _, n in self.kp_jobs), name])[-1]
        own = kwargs.get("job_id")
        kwargs["job_id"] = f"{self.kp_space}-{own}" if own else f"{self.kp_space}-{self.kp_order}-{step}"
        job = super().create_job(func, *args, **kwargs)
        self.kp_jobs.append((job.id, name))
        return job

    def enqueue_job(self, job: Any, *args: Any, **kwargs: Any) -> Any:
        return job if self.kp_dry else super().enqueue_job(job, *args, **kwargs)


class Order:
    """The app's function that enqueues one order, and the steps it makes."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        found = apps.load("rq", spec)
        if not callable(found):
            raise killpoint.InvalidTarget(f"target {shown('rq:' + spec)}: {type(found).__name__} is not a "
                                          f"function")
        self.place: Callable[[Any, str], Any] = found
        # a client that reaches no server: a function that does more than enqueue fails here, loudly
        nowhere = redis.Redis(unix_socket_path="/nonexistent/killpoint-dry-run")
        queue = self.enqueue(OrderQueue("kp-dry-run", connection=nowhere, space="dry", order_id=apps.ORDER_ID,
                                        dry=True))
        if not queue.kp_jobs:
            raise killpoint.InvalidTarget(f"target {shown('rq:' + spec)} enqueued no job: give the function "
                                          f"that enqueues one order, as place_order(queue, order_id)")
        self.tasks = [name for _, name in queue.kp_jobs]
        self.steps = apps.step_names(self.tasks)
        self.points = apps.user_points(fn for fn in map(_function, dict.fromkeys(self.tasks)) if fn is not None)

    def enqueue(self, queue: OrderQueue) -> OrderQueue:
        try:
            self.place(queue, queue.kp_order)
        except Exception as exc:  # noqa: BLE001 - the user's function: its failure is said in one line
            raise killpoint.InvalidTarget(f"target {shown('rq:' + self.spec)}: calling it with a queue and "
                                          f"{queue.kp_order!r} raised {type(exc).__name__}: {exc}"[:400]) from None
        return queue


def _function(name: str) -> Any:
    """The function a job's name (``pkg.module.function``) names, or None for a name that is not a
    module's attribute (a job RQ runs some other way). A module that cannot be imported is an
    :class:`InvalidTarget` naming it: its job could not run in the workers either, and its own
    ``killpoint.point`` calls would go undeclared, never crashed."""
    module, _, attr = name.rpartition(".")
    if not module:
        return None
    try:
        return getattr(importlib.import_module(module), attr, None)
    except ImportError as exc:
        raise killpoint.InvalidTarget(f"job {shown(name)}: its module {shown(module)} cannot be imported "
                                      f"({type(exc).__name__}: {exc})"[:400]) from None


_orders: dict[str, Order] = {}


def order(spec: str) -> Order:
    if spec not in _orders:
        _orders[spec] = Order(spec)
    return _orders[spec]


def workload(spec: str, seed: int = 0) -> Any:
    o = order(spec)
    return apps.order_workload("rq", spec, list(zip(o.steps, o.tasks)))


# -- in a worker ----------------------------------------------------------------------------------


def _where(job: Any) -> tuple[str, str] | None:
    ctx = _worker.get("ctx")
    return None if ctx is None else ctx.run.state["tasks"].get(job.id)


def _point(job: Any, name: str) -> None:
    where = _where(job)
    if where is not None:
        with chaos.at(*where):
            _worker["ctx"].point(name)


class Worker(SimpleWorker):  # type: ignore[misc]
    """RQ's SimpleWorker: a short heartbeat expiry, each job performed in its step, RQ's moments as
    crash points."""

    def get_heartbeat_ttl(self, job: Any, working_time: float = 0.0) -> int:
        return HEARTBEAT_TTL_S

    def perform_job(self, job: Any, *args: Any, **kwargs: Any) -> Any:
        where = _where(job)
        if where is None:
            return super().perform_job(job, *args, **kwargs)
        with chaos.at(*where):  # the user's points and the tagged requests belong to the job's step
            return super().perform_job(job, *args, **kwargs)

    def prepare_job_execution(self, job: Any, *args: Any, **kwargs: Any) -> None:
        super().prepare_job_execution(job, *args, **kwargs)
        _point(job, "started")

    def handle_job_success(self, job: Any, *args: Any, **kwargs: Any) -> None:
        super().handle_job_success(job, *args, **kwargs)
        _point(job, "finished")


def _work(ctx: Any) -> None:
    state = ctx.run.state
    apps.enter_worker(ctx)
    _worker.update(ctx=ctx)
    client = brokers.redis_client(state["redis"])
    queue = Queue(state["queue"], connection=client)
    worker = Worker([queue], connection=client, name=f"{state['space']}-{ctx.worker_id}")
    while not _done(state):
        maintain(queue)  # RQ's maintenance, under its lock: abandoned executions retried
        worker.work(burst=True, logging_level="CRITICAL")
        time.sleep(POLL_S)


# -- the run's state, read in the harness and in workers -------------------------------------------


def _statuses(state: dict[str, Any]) -> dict[str, str | None]:
    pipe = brokers.redis_client(state["redis"]).pipeline(transaction=False)
    for job_id in state["tasks"]:
        pipe.hget(f"rq:job:{job_id}", "status")
    return {job_id: (s.decode() if s is not None else None) for job_id, s in zip(state["tasks"], pipe.execute())}


def _done(state: dict[str, Any]) -> bool:
    """Every job finished or failed, or one failed and none is left to run (the ones depending on
    it stay deferred)."""
    statuses = list(_statuses(state).values())
    return all(s in FINAL for s in statuses) or ("failed" in statuses and not any(s in WAITING for s in statuses))


# -- in the harness -------------------------------------------------------------------------------


def setup(run: killpoint.TargetRun, *, spec: str) -> None:
    url = brokers.require_redis()
    o = order(spec)
    space = run.namespace
    state = run.state
    state.update(spec=spec, redis=url, space=space, queue=f"kp-{space}")
    brokers.remember(space, url)
    tasks: dict[str, tuple[str, str]] = {}
    state["tasks"] = tasks
    client = brokers.redis_client(url)
    for inst in run.workload.instances:
        queue = o.enqueue(OrderQueue(state["queue"], connection=client, space=space, order_id=inst.id))
        steps = apps.step_names(name for _, name in queue.kp_jobs)
        if steps != [s.name for s in inst.steps]:
            raise killpoint.InvalidTarget(f"target {shown('rq:' + spec)} enqueued the jobs {steps} for "
                                          f"{inst.id}, not the workload's {[s.name for s in inst.steps]}")
        tasks.update({job_id: (inst.id, step) for (job_id, _), step in zip(queue.kp_jobs, steps)})


def done(run: killpoint.TargetRun) -> bool:
    return _done(run.state)


def history(run: killpoint.TargetRun) -> list[dict[str, Any]]:
    state = run.state
    return read_history(brokers.redis_client(state["redis"]), state["tasks"], state["space"])


def final_states(run: killpoint.TargetRun) -> dict[tuple[str, str], str]:
    """Where each job's record leaves its step: from the same events as history()."""
    return queue_history.final_states_of(history(run), run.state["tasks"].values())


def teardown(run: killpoint.TargetRun) -> None:
    if "space" in run.state:
        brokers.purge(run.state["space"], GLOBAL_SETS, redis=run.state["redis"])


# -- the target -----------------------------------------------------------------------------------

_targets: dict[str, killpoint.Target] = {}


def target_for(spec: str) -> killpoint.Target:
    """The target ``rq:<spec>``: built once per process (the module imported, the order learnt)."""
    if spec not in _targets:
        o = order(spec)
        mine = tuple(p for p in o.points if p not in BEFORE + AFTER)

        def body(ctx: killpoint.WorkerContext) -> None:
            _work(ctx)

        # A worker holds its job from its start: frozen in it past the heartbeat, the job is
        # abandoned and enqueued again (when it has retries left).
        _targets[spec] = killpoint.Target(
            body, name=f"rq:{spec}", points=BEFORE + mine + AFTER, owns_state=True,
            workload=apps.workload_name("rq", spec), lease_points=BEFORE + mine,
            setup=lambda run: setup(run, spec=spec), done=done, final_states=final_states, history=history,
            teardown=teardown)
    return _targets[spec]


__all__ = ["Order", "OrderQueue", "final_states", "history", "order", "setup", "target_for", "teardown", "workload"]
