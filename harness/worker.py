"""The reference worker: the step protocol of DESIGN section 3, done right.

claim (database time, a new fence) -> call (stable idempotency key, the fence) -> receipt (the
downstream's answer, durably) -> commit (compare-and-set on state version, fence and owner). A
worker that finds a step some earlier attempt touched establishes its outcome first, with the pure
decision table of :mod:`harness.recovery`. Each method is one rule, so a mutant breaks exactly one.

A store connection that dies (:class:`StoreUnavailable`; :class:`OutcomeUnknown` when COMMIT was
already sent) ends the worker's work on its step, not the worker: the operation is journaled as
``fail`` or ``info``, the lease expires, and recovery settles the step from the receipt, the state
version and the fence, exactly as after a crash. The worker goes on with its next task.

One module, a little over 500 lines, on purpose: the protocol is read as one, and what the worker
is given (:class:`Timing`, :class:`WorkerContext`, its :class:`Heartbeat`) sits just before the class
that uses it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from killpoint import chaos, vocab
from killpoint.chaos.journal import Journal
from killpoint.harness import checkpoint, recovery, states
from killpoint.errors import InvalidConfig
from killpoint.harness.clock import Clock
from killpoint.harness.settings import timing_problem
from killpoint.harness.clock import current as current_clock
from killpoint.harness.declaration import InvalidPoint, TargetRun
from killpoint.harness.downstream import Answer, DownstreamClient, LostResponse
from killpoint.harness.intent import idempotency_key, intent_hash
from killpoint.harness.store.base import Claim, OutcomeUnknown, Store, StoreUnavailable
from killpoint.harness.workload import InstanceSpec, StepSpec, Workload, policy_of


@dataclass(frozen=True)
class Timing:
    """How long a lease lasts, how often it is renewed, when a hung holder must be flagged, and how
    often an idle worker looks again when nothing tells it a step moved. The defaults are what a
    production deployment uses; on the run's virtual clock they cost no wall time. With the clock
    off (``--real-time``) a run uses :data:`REAL_TIME_TIMING` unless told otherwise."""

    lease_ttl_ms: float = 30_000.0
    heartbeat_ms: float = 10_000.0
    stuck_bound_ms: float = 60_000.0
    poll_ms: float = 1_000.0

    def __post_init__(self) -> None:
        for name in ("lease_ttl_ms", "heartbeat_ms", "stuck_bound_ms", "poll_ms"):
            problem = timing_problem(getattr(self, name))
            if problem:
                raise InvalidConfig(f"Timing({name}={getattr(self, name)!r}): {problem}")

    @property
    def stuck_slack_ms(self) -> float:
        """How late past the stuck bound a hang may be flagged: the heartbeat and look periods."""
        return max(250.0, 2 * self.heartbeat_ms + 20 * self.poll_ms)

    @property
    def stuck_race_ms(self) -> tuple[float, float]:
        """The stalls whose end races the stuck monitor: from just short of the stuck bound to just
        past one of the monitor's check periods (a quarter of the bound) beyond it. A stall that ends
        there is flagged or not depending on where the monitor's checks fall, which real
        milliseconds (load, the machine) move: the same seed can give two verdicts. Shorter stalls
        are never flagged and longer ones always are. The margins (a twentieth of the bound on
        each side) cover the time between the last progress and the stall's start."""
        bound = self.stuck_bound_ms
        return bound * 0.95, bound * 1.30


# Short enough for a run in real time, long enough that a loaded machine rarely breaks them.
REAL_TIME_TIMING = Timing(lease_ttl_ms=120.0, heartbeat_ms=30.0, stuck_bound_ms=300.0, poll_ms=2.0)
# Leases the clock reads (database time) need a moment past their expiry: SQLite's clock ticks in
# milliseconds.
_EXPIRY_MARGIN_S = 0.002
# After a lost connection a worker opens another at once, after a breath (not a poll period: it has
# work in hand, and the lease it may still hold is running out); lost again, it waits twice as long
# each time, up to a poll period, so a worker whose every transaction fails (a store down, a
# ``terminate`` at each COMMIT) lets the run's clock move past it instead of holding it still.
_RECONNECT_S = 0.002


@dataclass
class WorkerContext:
    """All a target sees: who it is, the store, the downstream, its journal, points, the heartbeat.

    ``downstream_url`` is the base URL of this run's downstream for any HTTP client (``POST
    {downstream_url}/resources/{resource}``, ``GET {downstream_url}/receipts/{key}``); ``downstream``
    is killpoint's own client of it, safe to share between threads. ``run_dir`` is the run's own
    folder, ``run`` what the target's hooks saw in the harness (its ``state`` as ``setup`` left it),
    ``replaces`` the worker id of the dead worker this one replaces (None for a first start).
    """

    worker_id: str
    store: Store
    downstream: DownstreamClient
    journal: Journal
    workload: Workload
    timing: Timing = field(default_factory=Timing)
    # Renews the lease of the step being worked on (hold / release); one is made when none is given.
    heartbeat: "Heartbeat" = None  # type: ignore[assignment]  # made in __post_init__
    run_dir: str = ""
    downstream_url: str = ""
    # Invariant: None (any name) or the target's declared points; ctx.point refuses any other.
    points: "tuple[str, ...] | None" = None
    run: "TargetRun | None" = None
    replaces: str | None = None
    # The run's clock: wait through it (ctx.clock.sleep, wait_until) and the harness can move the
    # run's time past a wait when every worker waits, instead of anybody waiting it out.
    clock: Clock = field(default_factory=current_clock)

    def __post_init__(self) -> None:
        if self.heartbeat is None and self.store is not None:
            self.heartbeat = Heartbeat(self.store, self.journal, self.timing, self.clock)

    def point(self, name: str) -> str | None:
        """Mark crash point ``name``; what happens here comes from the schedule. A name the target
        did not declare raises :class:`InvalidPoint` at once (it could never be scheduled)."""
        if self.points is not None and name not in self.points:
            raise InvalidPoint(f"crash point {name!r} is not declared by this target, which declares "
                               f"{', '.join(self.points)}; add it to @killpoint.target(points=...)")
        return chaos.point(name)

    def pause_waits_for(self, lock: Any) -> None:
        """Declare a lock (anything with ``acquire``/``release``) that a ``pause`` takes before the
        harness freezes this process: a library thread holding it (a checkpointer's database lock)
        is then never frozen inside it, stalling every other worker."""
        failpoints = chaos.points.installed()
        if failpoints is not None:
            failpoints.pause_locks.append(lock)

    def at(self, instance: str | None, step: str | None) -> "contextlib.AbstractContextManager[None]":
        """Tell the crash points that follow which step they belong to, so that a schedule can name
        it (``A@charge.before_ack:kill``): ``with ctx.at("order-1", "charge"): ...``."""
        return chaos.at(instance, step)


class Heartbeat:
    """Renews the lease of the step being worked on, from a thread of its own.

    It proves liveness, not progress: a business thread that hangs while this goes on is what the
    progress monitor (``flag_stuck``) exists to catch.
    """

    def __init__(self, store: Store, journal: Journal, timing: Timing, clock: Clock | None = None):
        self._store = store.clone()
        self._journal = journal
        self._timing = timing
        self._clock = clock or current_clock()
        self._claim: Claim | None = None
        self._lock = threading.Lock()
        self._wake = self._clock.event()  # set when a lease is handed over: start renewing it
        self._thread: threading.Thread | None = None
        self._in_store = threading.Lock()  # held while the heartbeat is inside a store transaction
        failpoints = chaos.points.installed()
        if failpoints is not None:
            failpoints.pause_locks.append(self._in_store)

    def hold(self, claim: Claim) -> None:
        with self._lock:
            self._claim = claim
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
            self._thread.start()
        self._wake.set()

    def release(self) -> None:
        with self._lock:
            self._claim = None

    def _loop(self) -> None:
        # With no lease held it waits for one (holding no time); with one, it renews it every
        # period of the run's clock, counted from when it was handed over.
        next_beat = None
        while True:
            if self._wake.wait(math.inf if next_beat is None else next_beat):
                self._wake.clear()
                next_beat = self._clock.now() + self._timing.heartbeat_ms / 1000.0
                continue
            next_beat = self._clock.now() + self._timing.heartbeat_ms / 1000.0
            with self._lock:
                claim = self._claim
            if claim is None:
                next_beat = None
                continue
            try:
                with self._in_store:
                    renewed = self._store.heartbeat(claim, self._timing.lease_ttl_ms)
            except StoreUnavailable as exc:
                # The connection died (the store restarted, the session was ended): the store has
                # dropped it and the next beat opens another. The thread goes on; had it died, the
                # lease would lapse under a business thread still at work.
                self._journal.write(vocab.STORE_UNAVAILABLE, error=str(exc), thread="heartbeat",
                                    outcome_unknown=isinstance(exc, OutcomeUnknown))
                continue
            if not renewed:
                self._journal.write(vocab.HEARTBEAT_LOST, instance=claim.instance, step=claim.step,
                                    fence=claim.fence)
                with self._lock:
                    if self._claim is claim:
                        self._claim = None


@dataclass(frozen=True)
class Task:
    kind: str  # run | compensate | cancel
    row: dict[str, Any]


WAIT = "wait"
DONE = "done"


def _lease_free(row: dict[str, Any], now: float) -> bool:
    return row["owner_worker"] is None or (row["expires_at"] is not None and row["expires_at"] < now)


def plan(rows: list[dict[str, Any]], now: float, workload: Workload) -> Task | str:
    """What to do next, from a snapshot of the steps: a task, ``WAIT`` or ``DONE``. Pure.

    Steps run in order, each once the one before it succeeded. A failed step cancels the pending
    steps after it; when it asks for compensation, earlier steps that have one are compensated.
    Recovery never re-runs a succeeded step and never touches one in manual review.
    """
    waiting = False
    by_instance: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_instance.setdefault(row["instance"], []).append(row)
    for instance_id, steps in by_instance.items():
        inst = workload.instance(instance_id)
        failed = [r for r in steps if r["state"] == states.FAILED]
        if failed:
            first_failed = min(r["idx"] for r in failed)
            compensate = any(inst.step(r["step"]).compensate_on_failure for r in failed)
            for r in steps:
                spec = inst.step(r["step"])
                if r["idx"] > first_failed and r["state"] in (states.PENDING, states.RETRY_SCHEDULED) \
                        and r["owner_worker"] is None:
                    return Task("cancel", r)
                if compensate and spec.compensation and r["idx"] < first_failed and \
                        r["state"] in (states.SUCCEEDED, states.COMPENSATING):
                    if _lease_free(r, now):
                        return Task("compensate", r)
                    waiting = True
            continue
        for r in steps:
            if r["state"] == states.SUCCEEDED:
                continue
            if r["state"] in states.SETTLED:
                break  # manual review or awaiting approval: nothing after it runs
            if r["state"] in states.CLAIMABLE and _lease_free(r, now):
                return Task("run", r)
            waiting = True
            break
    return WAIT if waiting else DONE


class ReferenceWorker:
    """The correct worker. Mutants subclass it and override exactly one method."""

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx
        self.store = ctx.store
        self.journal = ctx.journal
        self.timing = ctx.timing
        self.heartbeat = ctx.heartbeat
        self._loaded: dict[str, checkpoint.Loaded] = {}  # instance id -> its verified checkpoint

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        clock = self.ctx.clock
        next_monitor = 0.0  # database time of the next stuck check
        backoff = _RECONNECT_S
        while True:
            try:
                now, rows = self.store.snapshot()
                task = plan(rows, now, self.ctx.workload)
                if task == DONE:
                    return
                # The stuck check runs a few times per bound, busy or idle, so a hung lease holder is
                # flagged even when no worker is idle (and an idle one does not check on every look).
                if now >= next_monitor:
                    next_monitor = now + self.timing.stuck_bound_ms / 4000.0
                    self.monitor()
                if not isinstance(task, Task):  # WAIT
                    # Nothing to do until a lease expires, the next stuck check, or another worker
                    # moves a step (the harness wakes us then): no polling in between.
                    clock.wait_until(self.wake_at(rows, now, next_monitor), or_moved=True)
                else:
                    self.execute(task)
                    clock.moved()
                backoff = _RECONNECT_S
            except StoreUnavailable as exc:
                # The store dropped the dead connection; the next call opens another. Whatever
                # step we were on is left to its lease and to recovery.
                self.journal.write(vocab.STORE_UNAVAILABLE, error=str(exc),
                                   outcome_unknown=isinstance(exc, OutcomeUnknown))
                clock.sleep(backoff)
                backoff = min(2 * backoff, max(_RECONNECT_S, self.timing.poll_ms / 1000.0))

    def wake_at(self, rows: list[dict[str, Any]], now: float, next_monitor: float) -> float:
        """When a waiting worker must look again by itself: the first lease to expire (just past
        it, database time) or the next stuck check, whichever comes first."""
        expiries = [r["expires_at"] for r in rows
                    if r["owner_worker"] is not None and r["expires_at"] is not None
                    and r["expires_at"] >= now]
        return min(min(expiries, default=math.inf) + _EXPIRY_MARGIN_S, next_monitor)

    def monitor(self) -> None:
        """Flag a lease whose heartbeat goes on while its step makes no progress."""
        if self.store.flag_stuck(self.timing.stuck_bound_ms, self.ctx.worker_id):
            self.ctx.clock.moved()  # the freed leases are there for the taking

    def execute(self, task: Task) -> None:
        row = task.row
        inst = self.ctx.workload.instance(row["instance"])
        spec = inst.step(row["step"])
        if task.kind == "cancel":
            self.store.settle(row["instance"], row["step"], expected_state_version=row["state_version"],
                              from_state=row["state"], to_state=states.CANCELLED,
                              worker=self.ctx.worker_id, reason="an earlier step failed")
            return
        with chaos.at(inst.id, spec.name):
            compensation = task.kind == "compensate"
            chaos.point("before_claim")
            claim = self.claim(row, compensation)
            if claim is None:
                return
            chaos.point("after_claim")
            self.heartbeat.hold(claim)
            try:
                chaos.point("heartbeat")
                loaded = self.load_instance(inst.id)
                if not loaded.ok:
                    self.commit(claim, states.MANUAL, reason=f"checkpoint refused: {loaded.reason}")
                    return
                self.work(inst, spec, claim, compensation)
            finally:
                self.heartbeat.release()

    def load_instance(self, instance_id: str) -> checkpoint.Loaded:
        """Verify an instance's checkpoint the first time this worker touches it: format,
        integrity (an HMAC when the deployment has a key) and definition (or a registered
        migration). A refused one sends the step to manual review; it is never silently run."""
        loaded = self._loaded.get(instance_id)
        if loaded is None:
            loaded = checkpoint.verify(self.store.instance(instance_id),
                                       self.ctx.workload.instance(instance_id),
                                       policy_of(self.ctx.workload))
            self._loaded[instance_id] = loaded
            if loaded.outcome != checkpoint.OK:
                self.journal.write(vocab.CHECKPOINT, instance=instance_id, outcome=loaded.outcome,
                                   reason=loaded.reason, fingerprint=loaded.fingerprint)
        return loaded

    # -- claim --------------------------------------------------------------------------------------
    def claim(self, row: dict[str, Any], compensation: bool) -> Claim | None:
        to_state = states.COMPENSATING if compensation else states.RUNNING
        op = self.journal.invoke(vocab.CLAIM, instance=row["instance"], step=row["step"],
                                 state_version=row["state_version"])
        try:
            claim = self.store.claim(row["instance"], row["step"], self.ctx.worker_id,
                                     expected_state_version=row["state_version"], from_state=row["state"],
                                     to_state=to_state, ttl_ms=self.timing.lease_ttl_ms,
                                     reset_attempt=row["state"] == states.SUCCEEDED)
        except StoreUnavailable as exc:
            self.lost(op, vocab.CLAIM, exc, instance=row["instance"], step=row["step"])
            raise
        if claim is None:
            self.journal.complete(op, vocab.CLAIM, vocab.FAIL, instance=row["instance"], step=row["step"])
        else:
            self.journal.complete(op, vocab.CLAIM, vocab.OK, instance=claim.instance, step=claim.step,
                                  fence=claim.fence, state_version=claim.state_version,
                                  attempt=claim.attempt)
        return claim

    # -- one attempt ----------------------------------------------------------------------------
    def work(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, compensation: bool) -> None:
        resource = spec.compensation if compensation else spec.resource
        done_state = states.COMPENSATED if compensation else states.SUCCEEDED
        if resource is None:  # a pure step: nothing outside to establish, just run it again
            self.commit(claim, done_state)
            return
        key = self.key(inst, spec, claim, compensation)
        receipt_key = key or idempotency_key(inst.id, spec.name, resource, spec.version)
        params = self.params(inst, spec, compensation)
        ihash = intent_hash(params)
        if claim.attempt > 1 or claim.from_state != (states.SUCCEEDED if compensation else states.PENDING):
            action = self.decide(inst, spec, claim, key, receipt_key, ihash, compensation)
            if action == recovery.RECORD_COMPLETION:
                self.commit(claim, done_state, recovered=True)
                return
            if action in (recovery.RECORD_FAILURE, recovery.EXHAUSTED):
                self.commit(claim, states.MANUAL if compensation else states.FAILED, reason=action)
                return
            if action == recovery.MANUAL_REVIEW:
                self.commit(claim, states.MANUAL, reason="outcome unknown and the activity is not retry-safe")
                return
        chaos.point("before_call")
        answer = self.call(inst, spec, claim, resource, key, params, ihash, compensation)
        if answer is None:  # lost answer or stale fence: stop; recovery settles it
            self.store.release(claim)  # refused (and not recorded) when the lease is not ours
            return
        chaos.point("after_call")
        outcome = self.classify(answer)
        if outcome == "transient":
            if not compensation:
                self.commit(claim, states.RETRY_SCHEDULED, status=answer.status)
            return
        chaos.point("before_receipt")
        self.record_receipt(claim, receipt_key, ihash, outcome, answer.body)
        chaos.point("after_receipt")
        chaos.point("before_commit")
        if outcome == "succeeded":
            self.commit(claim, done_state)
        else:
            self.commit(claim, states.MANUAL if compensation else states.FAILED,
                        reason=answer.body.get("error") or answer.body.get("status"))
        chaos.point("after_commit")

    def key(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, compensation: bool) -> str | None:
        """The step's stable idempotency key (its compensation's, when undoing it): the same on
        every attempt, so that the downstream can tell a retry from a new request."""
        return spec.compensation_key(inst.id) if compensation else spec.key(inst.id)

    def params(self, inst: InstanceSpec, spec: StepSpec, compensation: bool) -> dict[str, Any]:
        if compensation:
            return spec.compensation_params(inst.id) or {}
        return dict(spec.params)

    def decide(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, key: str | None,
               receipt_key: str, ihash: str, compensation: bool) -> str:
        """Gather the evidence about earlier attempts and run the decision table on it."""
        receipt = self.store.receipt(receipt_key)
        source = "local"
        if receipt is None and key is not None and spec.queryable:
            remote = self.ctx.downstream.receipt(key, fence=claim.fence,
                                                 fence_scope=f"{inst.id}:{spec.name}")
            if remote is not None:
                source = "downstream"
                found = self.classify_status(remote["status"])
                receipt = {"intent_hash": remote["intent_hash"], "status": found,
                           "response": remote.get("response") or {}}
                if found != "transient":
                    self.record_receipt(claim, receipt_key, remote["intent_hash"], found,
                                        receipt["response"])
        status: str | None = None
        if receipt is not None:
            status = receipt["status"]
            if receipt.get("intent_hash") not in (None, ihash):
                # The key holds an outcome for another intent: never take it as ours.
                status = "failed_permanent"
            if status not in ("succeeded", "failed_permanent"):
                status = None
        evidence = recovery.Evidence(lease_expired=True, receipt=status, retry_safe=spec.retry_safe,
                                     attempts=claim.attempt - 1, max_attempts=spec.max_attempts)
        action = recovery.recover(evidence)
        self.journal.write(vocab.RECOVER, instance=inst.id, step=spec.name, fence=claim.fence,
                           source=source if receipt else None, receipt=status,
                           retry_safe=spec.retry_safe, attempts=evidence.attempts,
                           max_attempts=spec.max_attempts, action=action)
        return action

    # -- call -------------------------------------------------------------------------------------
    def call(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, resource: str, key: str | None,
             params: dict[str, Any], ihash: str, compensation: bool) -> Answer | None:
        meta = {"instance": inst.id, "step": spec.name, "worker": self.ctx.worker_id,
                "attempt": claim.attempt, "direction": "compensation" if compensation else "forward"}
        op = self.journal.invoke(vocab.CALL, instance=inst.id, step=spec.name, resource=resource, key=key,
                                 intent_hash=ihash, fence=claim.fence, attempt=claim.attempt,
                                 direction=meta["direction"])
        try:
            answer = self.ctx.downstream.call(resource, key=key, params=params, meta=meta,
                                              fence=claim.fence, fence_scope=f"{inst.id}:{spec.name}",
                                              before_read=lambda: chaos.point("in_call"))
        except LostResponse as exc:
            self.journal.complete(op, vocab.CALL, vocab.INFO, instance=inst.id, step=spec.name, error=str(exc))
            return None
        kind = vocab.OK if answer.status < 300 else vocab.FAIL
        self.journal.complete(op, vocab.CALL, kind, instance=inst.id, step=spec.name, status=answer.status,
                              replay=answer.replay, error=answer.body.get("error"))
        if answer.status == 409 and answer.body.get("error") == "stale_fence":
            return None  # a newer lease holder exists: this worker stops working on the step
        return answer

    @staticmethod
    def classify_status(status: int) -> str:
        if status < 300:
            return "succeeded"
        if status in (409, 429) or status >= 500:
            return "transient"
        return "failed_permanent"  # 402 declined, 422 conflicting intent, 400 bad request

    def classify(self, answer: Answer) -> str:
        return self.classify_status(answer.status)

    # -- receipt and commit -----------------------------------------------------------------------
    def record_receipt(self, claim: Claim, key: str, ihash: str | None, status: str,
                       response: dict[str, Any]) -> None:
        op = self.journal.invoke(vocab.RECEIPT, instance=claim.instance, step=claim.step, key=key,
                                 status=status)
        try:
            self.store.record_receipt(claim, key, ihash, status, response)
        except StoreUnavailable as exc:
            self.lost(op, vocab.RECEIPT, exc, instance=claim.instance, step=claim.step)
            raise
        self.journal.complete(op, vocab.RECEIPT, vocab.OK, instance=claim.instance, step=claim.step)

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        op = self.journal.invoke(vocab.COMMIT, instance=claim.instance, step=claim.step, to_state=to_state,
                                 fence=claim.fence, expected_state_version=claim.state_version)
        try:
            ok = self.store.commit(claim, to_state, **detail)
        except StoreUnavailable as exc:
            self.lost(op, vocab.COMMIT, exc, instance=claim.instance, step=claim.step, to_state=to_state,
                      fence=claim.fence)
            raise
        self.journal.complete(op, vocab.COMMIT, vocab.OK if ok else vocab.FAIL, instance=claim.instance,
                              step=claim.step, to_state=to_state, fence=claim.fence)
        return ok

    def lost(self, op: int, kind: str, exc: StoreUnavailable, **data: Any) -> None:
        """Close an operation the store lost with its connection: ``info`` (it may have taken
        effect) when COMMIT had been sent, ``fail`` (it certainly did not) otherwise."""
        self.journal.complete(op, kind, vocab.INFO if isinstance(exc, OutcomeUnknown) else vocab.FAIL,
                              error=str(exc), **data)


def reference(ctx: WorkerContext) -> None:
    """The reference target."""
    ReferenceWorker(ctx).run()
