"""Temporal: the order's steps as Temporal activities, crashed where a real worker crashes.

``temporal-activity:naive`` and ``temporal-activity:keyed`` run each step of the order as an
activity with the official SDK's ``temporalio.testing.ActivityEnvironment``, inside killpoint's
forked worker processes, which the schedule kills at the activity's crash points.

**The harness plays the Temporal server's part here.** No Temporal server runs: killpoint's own
store stands for the server's record of each activity task. A claim of a step is the server handing
the activity task to a worker (``ActivityTaskStarted``, with the attempt number the server counts);
the lease is the activity's heartbeat timeout (the worker process heartbeats from a thread); a
commit is the worker reporting the result (``RespondActivityTaskCompleted``/``Failed``), which the
store refuses from a worker whose lease was taken over, as the server refuses a stale task token.
A worker killed inside an activity leaves its lease to expire; the activity is then handed out
again as the next attempt, as Temporal's retry policy does (at most ``max_attempts`` attempts,
then the step fails). A retryable error (5xx, a lost answer) schedules the next attempt; a
non-retryable ``ApplicationError`` (a declined card) fails the step, and the workflow's saga
compensates the steps before it.

The activity's ``info()`` carries the workflow id (the order), the activity id (the step, or
``step/compensate`` for its compensation) and the attempt. ``naive`` sends a new random
idempotency key in every attempt, so a retry after a crash that followed the HTTP call charges
twice; ``keyed`` sends ``workflow_id:activity_id``, the same in every attempt, and the downstream
replays the first answer.

Crash points (all in the activity task, in the order an attempt passes them):
``after_claim`` (the task is started, the activity not yet run), ``before_call``, ``in_call`` (the
request is answered, the answer not yet read), ``after_call`` (the activity has its answer and has
not returned), ``before_commit`` (the activity returned; its result not yet reported),
``after_commit`` (the server recorded the result).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

from killpoint import chaos, vocab
from killpoint.harness import states
from killpoint.harness.downstream import LostResponse
from killpoint.harness.intent import intent_hash
from killpoint.harness.servers import SdkMissing, call_downstream, check_policy, random_key
from killpoint.harness.store.base import Claim
from killpoint.harness.worker import ReferenceWorker, Task, WorkerContext
from killpoint.harness.workload import InstanceSpec, StepSpec

if TYPE_CHECKING:
    from killpoint.harness.declaration import Target

__all__ = ["ACTIVITY_POINTS", "ActivityWorker", "activity_target", "sdk"]

ACTIVITY_POINTS = ("after_claim", "before_call", "in_call", "after_call", "before_commit", "after_commit")
EXTRA = "pip install 'killpoint[temporal]'"


def sdk() -> Any:
    """The ``temporalio`` package, imported on first use (in the harness, before any fork)."""
    try:
        import temporalio.activity
        import temporalio.exceptions
        import temporalio.testing
    except ImportError as exc:
        raise SdkMissing(f"the Temporal targets need the temporalio SDK ({exc}); install it with "
                         f"{EXTRA}") from None
    return temporalio


def activity_id(spec: StepSpec, compensation: bool) -> str:
    return f"{spec.name}/compensate" if compensation else spec.name


def make_activity(ctx: WorkerContext, *, keyed: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The order's step as a Temporal activity: one request to the downstream.

    It raises a non-retryable ``ApplicationError`` for a permanent refusal (a declined card, a
    conflicting intent) and a retryable one for a transient answer; a lost answer propagates as
    the ``LostResponse`` it is, which Temporal treats as a retryable failure too.
    """
    temporalio = sdk()
    activity = temporalio.activity
    ApplicationError = temporalio.exceptions.ApplicationError

    @activity.defn(name="order_step")
    def order_step(request: dict[str, Any]) -> dict[str, Any]:
        info = activity.info()
        key = f"{info.workflow_id}:{info.activity_id}" if keyed else random_key()
        meta = {"instance": info.workflow_id, "step": request["step"], "worker": ctx.worker_id,
                "attempt": info.attempt, "direction": request["direction"],
                "activity_id": info.activity_id}
        ctx.journal.write(vocab.ACTIVITY, instance=info.workflow_id, step=request["step"],
                          activity_id=info.activity_id, attempt=info.attempt, key=key)
        chaos.point("before_call")
        op = ctx.journal.invoke("call", instance=info.workflow_id, step=request["step"],
                                resource=request["resource"], key=key,
                                intent_hash=intent_hash(request["params"]), fence=None,
                                attempt=info.attempt, direction=request["direction"])
        try:
            answer = call_downstream(ctx.downstream, resource=request["resource"], key=key,
                                     params=request["params"], meta=meta,
                                     in_call=lambda: chaos.point("in_call"))
        except LostResponse as exc:
            ctx.journal.complete(op, "call", "info", instance=info.workflow_id, step=request["step"],
                                 error=str(exc))
            raise
        ctx.journal.complete(op, "call", "ok" if answer.status < 300 else "fail",
                             instance=info.workflow_id, step=request["step"], status=answer.status,
                             replay=answer.replay, error=answer.body.get("error"))
        chaos.point("after_call")
        kind = ReferenceWorker.classify_status(answer.status)
        if kind == "transient":
            raise ApplicationError(f"downstream answered {answer.status}", answer.body,
                                   type="Transient")
        if kind == "failed_permanent":
            raise ApplicationError(f"downstream refused: {answer.status}", answer.body,
                                   type="Refused", non_retryable=True)
        return answer.body

    return order_step


class ActivityWorker(ReferenceWorker):
    """A Temporal worker process: takes activity tasks and runs them with ``ActivityEnvironment``.

    The loop (what to run next, the lease's heartbeat, the stuck monitor) and the store calls are
    the reference worker's: they are the server's part. What differs is the attempt: no receipt,
    no recovery decision -- the activity simply runs again, as Temporal re-runs it.
    """

    def __init__(self, ctx: WorkerContext, *, keyed: bool):
        super().__init__(ctx)
        temporalio = sdk()
        self.ApplicationError = temporalio.exceptions.ApplicationError
        self.env = temporalio.testing.ActivityEnvironment()
        self.activity = make_activity(ctx, keyed=keyed)

    def execute(self, task: Task) -> None:
        if task.kind == "cancel":
            super().execute(task)  # the workflow cancels the steps after a failed one
            return
        row = task.row
        inst = self.ctx.workload.instance(row["instance"])
        spec = inst.step(row["step"])
        compensation = task.kind == "compensate"
        with chaos.at(inst.id, spec.name):
            claim = self.claim(row, compensation)
            if claim is None:
                return
            self.heartbeat.hold(claim)
            try:
                chaos.point("after_claim")
                self.attempt(inst, spec, claim, compensation)
            finally:
                self.heartbeat.release()

    def attempt(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, compensation: bool) -> None:
        done_state = states.COMPENSATED if compensation else states.SUCCEEDED
        failed_state = states.MANUAL if compensation else states.FAILED
        if claim.attempt > spec.max_attempts:
            # The retry policy's maximum attempts are spent: the server fails the activity.
            self.commit(claim, failed_state, reason="retry policy: maximum attempts reached")
            return
        resource = spec.compensation if compensation else spec.resource
        if resource is None:
            chaos.point("before_commit")
            self.commit(claim, done_state)
            chaos.point("after_commit")
            return
        params = self.params(inst, spec, compensation)
        request = {"step": spec.name, "resource": resource, "params": params,
                   "direction": "compensation" if compensation else "forward"}
        self.env.info = dataclasses.replace(
            self.env.info, workflow_id=inst.id, workflow_run_id=f"{inst.id}-run",
            workflow_type="order", activity_id=activity_id(spec, compensation),
            activity_type="order_step", attempt=claim.attempt, task_queue="killpoint-orders",
            task_token=f"{inst.id}/{activity_id(spec, compensation)}/{claim.fence}".encode())
        try:
            self.env.run(self.activity, request)
        except Exception as exc:  # the SDK worker reports any exception as the attempt's failure
            if isinstance(exc, self.ApplicationError) and exc.non_retryable:
                chaos.point("before_commit")
                self.commit(claim, failed_state, reason=str(exc))
                chaos.point("after_commit")
            elif not compensation:
                self.commit(claim, states.RETRY_SCHEDULED, reason=f"{type(exc).__name__}: {exc}")
            # A failed compensation is handed out again once its lease is free.
            return
        chaos.point("before_commit")
        self.commit(claim, done_state)
        chaos.point("after_commit")


def _replay_in_child(workflow: type) -> list[dict[str, Any]]:
    """Replay the recorded histories against ``workflow`` in a forked child, so that the SDK's
    runtime threads never start in the harness, which forks the workers afterwards."""
    import multiprocess

    from killpoint.harness.servers.temporal_replay import ERROR, Replayed, replay

    def child(conn: Any) -> None:
        try:
            conn.send([r.event() for r in replay(workflow)])
        except BaseException as exc:  # noqa: BLE001 - the parent reports it as an error
            conn.send([Replayed("*", workflow.__qualname__, ERROR, f"{type(exc).__name__}: {exc}").event()])
        conn.close()

    ctx = multiprocess.get_context("fork")
    parent_end, child_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(child_end,), name="killpoint-temporal-replay")
    proc.start()
    child_end.close()
    try:
        if not parent_end.poll(120):
            raise TimeoutError("replaying the recorded histories took over 120 s")
        events: list[dict[str, Any]] = parent_end.recv()
    except (EOFError, TimeoutError) as exc:
        events = [Replayed("*", workflow.__qualname__, ERROR, f"the replay process failed: {exc}").event()]
    finally:
        parent_end.close()
        if proc.is_alive():
            proc.kill()
        proc.join()
    return events


@functools.lru_cache(maxsize=16)
def replayed(workflow: type) -> tuple[dict[str, Any], ...]:
    """The replay of the recorded histories against ``workflow``, once per harness process: it
    depends only on the workflow code and the recorded histories, neither of which a run changes."""
    return tuple(_replay_in_child(workflow))


def _run_activities(ctx: WorkerContext, *, keyed: bool, replays: tuple[dict[str, Any], ...]) -> None:
    # What this deployment's workflow code does with the histories recorded from earlier runs (as
    # a new worker would when it picks an open workflow up); judged by replay_compatible.
    for event in replays:
        ctx.journal.write(vocab.REPLAYED, **event)
    ActivityWorker(ctx, keyed=keyed).run()


def activity_target(policy: str, *, workflow: type | None = None) -> "Target":
    """``temporal-activity:naive`` or ``temporal-activity:keyed``: the activities, and the
    replay of the recorded histories against ``workflow`` (default: the shipped ``OrderWorkflow``).
    Imports the SDK here, in the harness, so that forked workers do not pay for it.

    Killpoint's store is the server's record here (see the module's doc), so the target does not
    own its state: every invariant judges it. Its workload is ``plain`` unless a run names another.
    """
    from killpoint.harness.declaration import Target

    check_policy("temporal-activity", policy)
    sdk()
    if workflow is None:
        from killpoint.harness.servers.temporal_orders import OrderWorkflow as workflow
    fn = functools.partial(_run_activities, keyed=policy == "keyed", replays=replayed(workflow))
    return Target(fn, points=ACTIVITY_POINTS, owns_state=False, workload="plain",
                  name=f"temporal-activity:{policy}")
