"""Temporal on a real server: ``temporal:naive`` and ``temporal:keyed``.

The order runs as ``OrderWorkflow`` (:mod:`killpoint.harness.servers.temporal_orders`) on the
Temporal frontend at ``$KILLPOINT_TEMPORAL_ADDRESS`` (``HOST:PORT``, namespace ``default`` unless
``$KILLPOINT_TEMPORAL_NAMESPACE`` says otherwise). Each killpoint worker process is a real Temporal
worker (``temporalio.worker.Worker``) polling the run's own task queue; the schedule kills it (or
freezes it) inside an activity, and the server notices the lost attempt when its start-to-close
timeout (1 s here) expires and retries it on a live worker, as in production. Nothing is simulated:
the server keeps the state, so the target owns it; ``done`` asks the server whether every order's
workflow has closed, and ``history`` maps the workflow histories, the server's own record of each
activity task, onto store events (:mod:`killpoint.harness.servers.server_history`), from which
``final_states`` takes each step's outcome.

Workflow ids carry the run's namespace, so runs never meet on a shared server. Every worker starts
the run's workflows when it starts (a start of a workflow id that is already running is a no-op),
then serves until every one of them has closed.

The harness process never creates the SDK's runtime (its threads would not survive the forks of the
workers): its queries to the server run in a forked child.

Crash points, in the activity: ``before_call``, ``in_call`` (the request answered, the answer
unread), ``after_call`` (the answer read, the activity not yet returned).
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from killpoint import chaos
from killpoint.harness.servers import SdkMissing, check_policy, random_key
from killpoint.harness.servers.server_history import final_states_of, temporal_events
from killpoint.harness.servers.temporal import sdk

if TYPE_CHECKING:
    from killpoint.harness.declaration import Target, TargetRun
    from killpoint.harness.worker import WorkerContext

__all__ = ["ADDRESS_ENV", "POINTS", "address", "server_target"]

ADDRESS_ENV = "KILLPOINT_TEMPORAL_ADDRESS"
NAMESPACE_ENV = "KILLPOINT_TEMPORAL_NAMESPACE"
POINTS = ("before_call", "in_call", "after_call")
START_TO_CLOSE_MS = 1000


class NoServer(SdkMissing):
    """No Temporal frontend was given (say how to give one)."""


def address() -> str:
    given = os.environ.get(ADDRESS_ENV, "").strip()
    if not given:
        raise NoServer(f"the temporal:* targets need a Temporal frontend: set {ADDRESS_ENV}=HOST:PORT "
                       f"(for example a dev server: temporal server start-dev --ip 127.0.0.1)")
    host, sep, port = given.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise NoServer(f"{ADDRESS_ENV}={given[:200]!r}: expected HOST:PORT")
    return given


def namespace() -> str:
    return os.environ.get(NAMESPACE_ENV, "").strip() or "default"


def _reachable(addr: str) -> None:
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=3):
        pass


# ----------------------------------------------------------------------------------------------
# the harness's side


def _order_input(inst: Any) -> dict[str, Any]:
    steps = {s.name: {"step": s.name, "resource": s.resource, "params": dict(s.params),
                      "direction": "forward"} for s in inst.steps if s.resource is not None}
    reserve = next((s for s in inst.steps if s.name == "reserve"), None)
    if reserve is not None and reserve.compensation:
        steps["release"] = {"step": "reserve", "resource": reserve.compensation,
                            "params": {"undo": reserve.key(inst.id), **reserve.params},
                            "direction": "compensation"}
    # Temporal's default retry policy (no maximum): a worker frozen while it still holds polls is
    # handed attempts it cannot run, each lost after the timeout, until a live worker gets one.
    return {"steps": steps, "start_to_close_ms": START_TO_CLOSE_MS, "max_attempts": 0}


def setup(run: "TargetRun") -> None:
    addr = address()
    _reachable(addr)
    run.state["temporal"] = {
        "address": addr, "namespace": namespace(), "task_queue": f"killpoint-{run.namespace}",
        "workflows": {f"{run.namespace}-{inst.id}": (inst.id, _order_input(inst))
                      for inst in run.workload.instances}}


class _Querier:
    """One forked helper process per harness process that holds a client of the server and answers
    ``_describe`` calls over a pipe: the SDK's runtime starts there, once (it costs about two
    seconds), never in the harness, which forks workers. It dies with the harness."""

    def __init__(self) -> None:
        import multiprocess

        ctx = multiprocess.get_context("fork")
        self.conn, child_end = ctx.Pipe()
        self.proc = ctx.Process(target=self._serve, args=(child_end,), name="killpoint-temporal-query",
                                daemon=True)
        self.proc.start()
        child_end.close()
        self.lock = threading.Lock()

    @staticmethod
    def _serve(conn: Any) -> None:
        import ctypes
        import signal

        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: end with the harness
        except (OSError, AttributeError):
            pass
        # The harness's handlers came with the fork; this helper just ends when told to.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        loop = asyncio.new_event_loop()
        clients: dict[tuple[str, str], Any] = {}
        while True:
            try:
                cfg = conn.recv()
            except EOFError:
                return
            try:
                conn.send(("ok", loop.run_until_complete(_describe_async(cfg, clients))))
            except BaseException as exc:  # noqa: BLE001 - sent to the harness, which raises it
                conn.send(("error", f"{type(exc).__name__}: {exc}"))

    def ask(self, cfg: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.conn.send(cfg)
            if not self.conn.poll(60):
                raise TimeoutError("a query to the Temporal server took over 60 s")
            kind, value = self.conn.recv()
        if kind != "ok":
            raise RuntimeError(f"querying the Temporal server: {value}")
        return value  # type: ignore[no-any-return]


_querier: tuple[int, _Querier] | None = None  # (the process it belongs to, the helper)


def _query(cfg: dict[str, Any]) -> dict[str, Any]:
    """Ask this process's helper. A process forked after the harness made its helper (a ``--jobs``
    runner) makes its own: the inherited helper is not its child, and its pipe is the harness's."""
    global _querier
    if _querier is None or _querier[0] != os.getpid() or not _querier[1].proc.is_alive():
        _querier = (os.getpid(), _Querier())
    return _querier[1].ask(cfg)


def _quiet_runtime() -> Any:
    """The SDK's runtime with its core logging errors only (it warns, on stdout, about every
    completion of an attempt the server already timed out, which is what a crash test causes)."""
    from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))))


# The history events server_history maps, by the name of their attributes in Temporal's protobuf.
_ACTIVITY_EVENTS = {"activity_task_scheduled_event_attributes": "scheduled",
                    "activity_task_started_event_attributes": "started",
                    "activity_task_completed_event_attributes": "completed",
                    "activity_task_failed_event_attributes": "failed",
                    "activity_task_timed_out_event_attributes": "timed_out",
                    "activity_task_canceled_event_attributes": "canceled"}
_CLOSING_EVENTS = {f"workflow_execution_{how}_event_attributes": how for how in
                   ("completed", "failed", "canceled", "terminated", "timed_out", "continued_as_new")}


def _compact(history: Any, desc: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A workflow's activity and closing events, and its in-flight attempts, as the plain mappings
    :func:`~killpoint.harness.servers.server_history.temporal_events` reads (they cross a pipe)."""
    events: list[dict[str, Any]] = []
    for e in history.events:
        which = e.WhichOneof("attributes")
        what = _ACTIVITY_EVENTS.get(which) or ("closed" if which in _CLOSING_EVENTS else None)
        if what is None:
            continue
        a = getattr(e, which)
        row: dict[str, Any] = {"event": what, "id": e.event_id, "t": e.event_time.ToNanoseconds()}
        if what == "closed":
            row["how"] = _CLOSING_EVENTS[which]
        elif what == "scheduled":
            row["activity_id"] = a.activity_id
        else:
            row["scheduled"] = a.scheduled_event_id
            if what != "started":
                row["started"] = a.started_event_id
            if what in ("started", "completed", "failed", "canceled"):
                row["identity"] = a.identity
            if what == "started":
                row["attempt"] = a.attempt
                if a.HasField("last_failure"):
                    row["failure"] = a.last_failure.message
            elif what in ("failed", "timed_out") and a.HasField("failure"):
                row["failure"] = a.failure.message
        events.append(row)
    pending = [{"activity_id": p.activity_id, "attempt": p.attempt, "identity": p.last_worker_identity,
                "t": p.last_started_time.ToNanoseconds()}
               for p in desc.raw_description.pending_activities if p.state == 2]  # STARTED: an attempt runs
    return events, pending


async def _describe_async(cfg: dict[str, Any], clients: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """Per workflow id: its status, its activity and closing events and its in-flight attempts
    (:func:`_compact`), from the server's record of it."""
    from temporalio.client import Client

    key = (cfg["address"], cfg["namespace"])
    if key not in clients:
        clients[key] = await Client.connect(cfg["address"], namespace=cfg["namespace"],
                                            runtime=_quiet_runtime())
    client = clients[key]
    out: dict[str, Any] = {}
    for wid in cfg["workflows"]:
        handle = client.get_workflow_handle(wid)
        try:
            desc = await handle.describe()
        except Exception:  # noqa: BLE001 - not started (yet)
            out[wid] = {"status": None, "events": [], "pending": []}
            continue
        history = await handle.fetch_history()
        events, pending = _compact(history, desc)
        out[wid] = {"status": desc.status.name if desc.status is not None else None, "events": events,
                    "pending": pending}
    return out


def done(run: "TargetRun") -> bool:
    found = _query(run.state["temporal"])
    run.state["described"] = found
    closed = all(v["status"] not in (None, "RUNNING") for v in found.values())
    # A closed workflow's history no longer changes: history() and final_states() read this one.
    run.state["described_closed"] = closed
    return closed


def _described(run: "TargetRun") -> dict[str, Any]:
    """The server's record of every workflow of the run: the one done() read once all had closed,
    else read now."""
    if run.state.get("described_closed"):
        return run.state["described"]  # type: ignore[no-any-return]
    found = run.state["described"] = _query(run.state["temporal"])
    return found


def history(run: "TargetRun") -> list[dict[str, Any]]:
    """Each workflow's history as store events (:func:`~killpoint.harness.servers.server_history.temporal_events`)."""
    cfg = run.state["temporal"]
    found = _described(run)
    offset = time.time_ns() - time.monotonic_ns()
    rows: list[dict[str, Any]] = []
    for wid, (instance, _order) in cfg["workflows"].items():
        info = found.get(wid) or {}
        steps = [s.name for s in run.workload.instance(instance).steps]
        rows += temporal_events(instance, info.get("events", ()), steps=steps, offset_ns=offset,
                                pending=info.get("pending", ()))
    run.state["history_rows"] = rows
    return rows


def final_states(run: "TargetRun") -> dict[tuple[str, str], str]:
    """Each step's state where the workflow's history (:func:`history`) left it: the same record,
    so the two never disagree."""
    rows = run.state.get("history_rows")
    if rows is None:
        rows = history(run)
    return final_states_of(rows, [(inst.id, s.name) for inst in run.workload.instances for s in inst.steps])


# ----------------------------------------------------------------------------------------------
# the worker's side

_POINT_LOCK = threading.Lock()


def _point(instance: str, step: str, name: str) -> None:
    with _POINT_LOCK, chaos.at(instance, step):
        chaos.point(name)


def _activities(ctx: "WorkerContext", *, keyed: bool, instances: dict[str, str]) -> list[Any]:
    from temporalio import activity
    from temporalio.exceptions import ApplicationError

    def make(name: str) -> Any:
        @activity.defn(name=name)
        async def step(request: dict[str, Any]) -> dict[str, Any]:
            info = activity.info()
            workflow_id = str(info.workflow_id)
            instance = instances.get(workflow_id, workflow_id)
            step_name = request["step"]
            key = f"{info.workflow_id}:{info.activity_id}" if keyed else random_key()
            _point(instance, step_name, "before_call")
            # Blocking, on the worker's event loop on purpose: a kill at in_call or after_call hits
            # the process while this activity, and no other, is inside its call.
            answer = ctx.downstream.call(request["resource"], key=key, params=request["params"],
                                         meta={"instance": instance, "step": step_name,
                                               "worker": ctx.worker_id, "attempt": info.attempt,
                                               "direction": request["direction"],
                                               "activity_id": info.activity_id},
                                         before_read=lambda: _point(instance, step_name, "in_call"))
            _point(instance, step_name, "after_call")
            if answer.status >= 300:
                permanent = 400 <= answer.status < 500 and answer.status not in (409, 429)
                raise ApplicationError(f"downstream answered {answer.status}", answer.body,
                                       non_retryable=permanent)
            return dict(answer.body)
        return step

    return [make("reserve"), make("charge"), make("release")]


def serve(ctx: "WorkerContext", *, keyed: bool) -> None:
    """A worker: start the run's workflows (idempotently) and serve them until all have closed."""
    from temporalio.client import Client
    from temporalio.common import WorkflowIDConflictPolicy
    from temporalio.worker import Worker

    from killpoint.harness.servers.temporal_orders import OrderWorkflow

    run = ctx.run
    assert run is not None, "the temporal target needs the run its setup() prepared"
    cfg = run.state["temporal"]
    instances = {wid: inst for wid, (inst, _order) in cfg["workflows"].items()}

    async def main() -> None:
        client = await Client.connect(cfg["address"], namespace=cfg["namespace"], runtime=_quiet_runtime(),
                                      identity=f"killpoint-{ctx.worker_id}-{os.getpid()}")
        handles = []
        for wid, (_inst, order) in cfg["workflows"].items():
            handles.append(await client.start_workflow(
                OrderWorkflow.run, order, id=wid, task_queue=cfg["task_queue"],
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                task_timeout=timedelta(seconds=2)))
        # No workflow cache: a killed worker leaves no sticky queue behind for the next task.
        async with Worker(client, task_queue=cfg["task_queue"], workflows=[OrderWorkflow],
                          activities=_activities(ctx, keyed=keyed, instances=instances),
                          max_cached_workflows=0, graceful_shutdown_timeout=timedelta(seconds=0)):
            for handle in handles:
                try:
                    await handle.result()
                except Exception:  # noqa: BLE001 - a failed order (its saga ran) has closed too
                    pass

    import warnings

    # The SDK warns when the server cancels an attempt it already timed out: expected here.
    warnings.filterwarnings("ignore", message="Cannot find activity to cancel")
    asyncio.run(main())


def server_target(policy: str) -> "Target":
    """``temporal:naive`` or ``temporal:keyed`` against ``$KILLPOINT_TEMPORAL_ADDRESS``."""
    from killpoint.harness.declaration import Target

    check_policy("temporal", policy)
    sdk()
    address()
    fn = functools.partial(serve, keyed=policy == "keyed")
    return Target(fn, points=POINTS, owns_state=True, workload="plain", name=f"temporal:{policy}",
                  setup=setup, done=done, final_states=final_states, history=history)
