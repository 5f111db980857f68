"""The mutant zoo: the reference worker (or downstream) with exactly one rule broken.

A verifier is only worth what it catches. Each mutant breaks one rule of DESIGN sections 3 and 5,
names the invariant that must catch it, and carries the schedule (at most two faults) that shows
it. ``killpoint selftest`` runs them all; a mutant that survives means a checker went blind.

Each worker mutant subclasses :class:`ReferenceWorker` and overrides the one method its rule lives
in (``local-clock-lease`` needs two: the claim, where it learns its lease end, and the commit,
where it trusts it). The store has no switch to turn a rule off: a mutant whose bug is in how it
writes wraps its store (:class:`BlindCommits`), as a worker that writes the row itself would.
Because the claim raises the state version and the lease version (the fence) in one statement, a
stale commit is refused by either half of the compare-and-set alone; the mutants that break the
commit's compare-and-set therefore drop both halves, and say which invariant they are there to
exercise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from killpoint import vocab
from killpoint.errors import StoreError
from killpoint.harness import checkpoint, recovery, states, zoo_queue
from killpoint.harness.downstream import Answer
from killpoint.harness.store.base import Claim, Store, StoreUnavailable
from killpoint.harness.store.sql import SqlStore
from killpoint.harness.worker import (DONE, WAIT, Heartbeat, ReferenceWorker, Task, Timing, WorkerContext, plan,
                                     reference)
from killpoint.harness.workload import InstanceSpec, StepSpec

Target = Callable[[WorkerContext], None]


@dataclass(frozen=True)
class Mutant:
    """One broken rule, the invariant that must catch it and the schedule that shows it."""

    name: str
    breaks: str  # the rule broken, in a sentence
    caught_by: str  # the invariant that must report it
    target: Target
    schedule: str  # at most two faults, in the schedule text form
    # Overrides merged into the run's downstream configuration (a downstream mutant).
    downstream: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    workers: int = 2  # workers per run for the schedule to land deterministically
    # A tighter run bound for a mutant whose bug is that nothing ever moves again.
    bound_s: float | None = None
    # A named workload (harness.workload.WORKLOADS) for a bug the default workload cannot show,
    # such as a damaged checkpoint; named, not built, so the replay command can say it.
    workload: str | None = None
    # Timing overrides (Timing field -> ms) for a bug that shows only when one period is short next
    # to a step's work: the same on the virtual clock and off it.
    timing: Mapping[str, float] | None = None
    # The correct target that must stay valid on the same schedule (None: the reference worker); a
    # mutant of a target that owns its state names its own correct twin.
    reference: str | None = None

    @property
    def target_name(self) -> str:
        return f"mutant:{self.name}"

    def run_overrides(self) -> dict[str, Any]:
        """RunConfig fields the counterexample needs besides its schedule and target."""
        extra: dict[str, Any] = {"workers": self.workers}
        if self.bound_s is not None:
            extra["bound_s"] = self.bound_s
        if self.workload is not None:
            extra["workload"] = self.workload
        if self.timing is not None:
            extra["timing"] = Timing(**self.timing)
        return extra


# ---------------------------------------------------------------------------------------------
# a store that breaks a rule


def blind_commit(store: Store, claim: Claim, to_state: str, **detail: Any) -> bool:
    """Write the claim's step to ``to_state`` with no compare-and-set at all: no state version, no
    fence, no owner -- what a worker that updates the row itself does. The store records it as an
    ordinary ``committed`` event, so the history shows what such a write does to the step."""
    if not isinstance(store, SqlStore):
        raise StoreError(f"a blind commit needs an SQL store, not {type(store).__name__}")
    if not states.allowed(claim.state, to_state):
        raise StoreError(f"illegal transition {claim.state} -> {to_state} for {claim.instance}:{claim.step}")

    def do(cur: Any) -> bool:
        row = cur.execute(store._q(
            "UPDATE {steps} SET state = ?, state_version = ?, owner_worker = NULL, expires_at = NULL, "
            "progress_at = {now} WHERE instance = ? AND step = ? RETURNING state_version, lease_version"),
            (to_state, claim.state_version + 1, claim.instance, claim.step)).fetchone()
        if row is None:
            raise StoreError(f"no step {claim.instance}:{claim.step} in the store")
        store._event(cur, "committed", claim.instance, claim.step, worker=claim.worker,
                     from_state=claim.state, to_state=to_state, state_version=row[0], fence=claim.fence,
                     lease_version=row[1], attempt=claim.attempt, **detail)
        return True
    return store._write(do)


def unfenced_commit(store: Store, claim: Claim, to_state: str, **detail: Any) -> bool:
    """Write the claim's step under a compare-and-set on the state version read just before, in
    the same transaction, and no fence or owner: the version check is there, but against what the
    row holds now rather than what the claim saw, so it stops nothing the fence would have stopped.
    The chain of versions stays unbroken (+1 on whatever is there); only the fence tells the write
    was stale."""
    if not isinstance(store, SqlStore):
        raise StoreError(f"an unfenced commit needs an SQL store, not {type(store).__name__}")
    if not states.allowed(claim.state, to_state):
        raise StoreError(f"illegal transition {claim.state} -> {to_state} for {claim.instance}:{claim.step}")

    def do(cur: Any) -> bool:
        now = cur.execute(store._q("SELECT state_version FROM {steps} WHERE instance = ? AND step = ?{lock}"),
                          (claim.instance, claim.step)).fetchone()
        if now is None:
            raise StoreError(f"no step {claim.instance}:{claim.step} in the store")
        row = cur.execute(store._q(
            "UPDATE {steps} SET state = ?, state_version = state_version + 1, owner_worker = NULL, "
            "expires_at = NULL, progress_at = {now} WHERE instance = ? AND step = ? AND state_version = ? "
            "RETURNING state_version, lease_version"),
            (to_state, claim.instance, claim.step, now[0])).fetchone()
        if row is None:
            return False
        store._event(cur, "committed", claim.instance, claim.step, worker=claim.worker,
                     from_state=claim.state, to_state=to_state, state_version=row[0], fence=claim.fence,
                     lease_version=row[1], attempt=claim.attempt, **detail)
        return True
    return store._write(do)


def state_guarded_commit(store: Store, claim: Claim, to_state: str, **detail: Any) -> bool:
    """Write the claim's step guarded only by the state it claimed (``UPDATE ... WHERE step = ? AND
    state = 'running'``): no fence, no owner, no version. A stale worker's commit is refused once the
    new holder has committed (the state is no longer the claimed one), and lands in the window
    between the new holder's claim and its commit, where the state is still the claimed one."""
    if not isinstance(store, SqlStore):
        raise StoreError(f"a state-guarded commit needs an SQL store, not {type(store).__name__}")
    if not states.allowed(claim.state, to_state):
        raise StoreError(f"illegal transition {claim.state} -> {to_state} for {claim.instance}:{claim.step}")

    def do(cur: Any) -> bool:
        row = cur.execute(store._q(
            "UPDATE {steps} SET state = ?, state_version = state_version + 1, owner_worker = NULL, "
            "expires_at = NULL, progress_at = {now} WHERE instance = ? AND step = ? AND state = ? "
            "RETURNING state_version, lease_version"),
            (to_state, claim.instance, claim.step, claim.state)).fetchone()
        if row is None:
            store._event(cur, "commit_rejected", claim.instance, claim.step, worker=claim.worker,
                         from_state=claim.state, to_state=to_state, fence=claim.fence,
                         attempt=claim.attempt, **detail)
            return False
        store._event(cur, "committed", claim.instance, claim.step, worker=claim.worker,
                     from_state=claim.state, to_state=to_state, state_version=row[0], fence=claim.fence,
                     lease_version=row[1], attempt=claim.attempt, **detail)
        return True
    return store._write(do)


class Delegating:
    """A store that passes every call to ``inner``: subclass it and override the call a mutant breaks."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    @property
    def url(self) -> str:
        return self.inner.url

    def setup(self, instances: Iterable[Mapping[str, Any]]) -> None:
        self.inner.setup(instances)

    def now(self) -> float:
        return self.inner.now()

    def snapshot(self) -> tuple[float, list[dict[str, Any]]]:
        return self.inner.snapshot()

    def steps(self) -> list[dict[str, Any]]:
        return self.inner.steps()

    def step_progress(self, instance: str, step: str) -> tuple[int, str | None] | None:
        return self.inner.step_progress(instance, step)

    def events(self) -> list[dict[str, Any]]:
        return self.inner.events()

    def instance(self, instance: str) -> dict[str, Any]:
        return self.inner.instance(instance)

    def receipt(self, key: str) -> dict[str, Any] | None:
        return self.inner.receipt(key)

    def claim(self, instance: str, step: str, worker: str, *, expected_state_version: int,
              from_state: str, to_state: str, ttl_ms: float, reset_attempt: bool = False) -> Claim | None:
        return self.inner.claim(instance, step, worker, expected_state_version=expected_state_version,
                                from_state=from_state, to_state=to_state, ttl_ms=ttl_ms,
                                reset_attempt=reset_attempt)

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        return self.inner.commit(claim, to_state, **detail)

    def settle(self, instance: str, step: str, *, expected_state_version: int, from_state: str,
               to_state: str, worker: str, **detail: Any) -> bool:
        return self.inner.settle(instance, step, expected_state_version=expected_state_version,
                                 from_state=from_state, to_state=to_state, worker=worker, **detail)

    def heartbeat(self, claim: Claim, ttl_ms: float) -> bool:
        return self.inner.heartbeat(claim, ttl_ms)

    def release(self, claim: Claim) -> bool:
        return self.inner.release(claim)

    def progress(self, claim: Claim) -> None:
        self.inner.progress(claim)

    def record_receipt(self, claim: Claim, key: str, intent_hash: str | None, status: str,
                       response: dict[str, Any]) -> None:
        self.inner.record_receipt(claim, key, intent_hash, status, response)

    def flag_stuck(self, bound_ms: float, worker: str) -> list[tuple[str, str]]:
        return self.inner.flag_stuck(bound_ms, worker)

    def resolve(self, instance: str, step: str, to_state: str, *, actor: str, evidence: str) -> bool:
        return self.inner.resolve(instance, step, to_state, actor=actor, evidence=evidence)

    def clone(self) -> Store:
        return type(self)(self.inner.clone())

    def close(self) -> None:
        self.inner.close()

    def drop(self) -> None:
        self.inner.drop()

    def backends(self) -> dict[str, list[int]]:
        return self.inner.backends()

    def terminate_backends(self, pids: Iterable[int], *, await_idle: Iterable[int] = (),
                           timeout_s: float = 10.0) -> dict[str, Any]:
        return self.inner.terminate_backends(pids, await_idle=await_idle, timeout_s=timeout_s)

    def set_clock(self, offset_s: float) -> None:
        self.inner.set_clock(offset_s)


class BlindCommits(Delegating):
    """A store whose every commit is a :func:`blind_commit`: the compare-and-set is gone."""

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        return blind_commit(self.inner, claim, to_state, **detail)


class UnfencedCommits(Delegating):
    """A store whose every commit is an :func:`unfenced_commit`: no fence, a version read afresh."""

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        return unfenced_commit(self.inner, claim, to_state, **detail)


class StateGuardedCommits(Delegating):
    """Commits guarded by the claimed state alone (see :func:`state_guarded_commit`)."""

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        return state_guarded_commit(self.inner, claim, to_state, **detail)


class RenewByInstance(Delegating):
    """A store whose heartbeat renews a step's lease by instance and step alone, not by holder and
    fence, and records the renewal as any renewal (who renewed, with which fence)."""

    def heartbeat(self, claim: Claim, ttl_ms: float) -> bool:
        store = self.inner
        if not isinstance(store, SqlStore):
            raise StoreError(f"renewing by instance needs an SQL store, not {type(store).__name__}")

        def do(cur: Any) -> bool:
            row = cur.execute(store._q(
                "UPDATE {steps} SET expires_at = {now} + ?, heartbeat_at = {now} "
                "WHERE instance = ? AND step = ? RETURNING lease_version"),
                (ttl_ms / 1000.0, claim.instance, claim.step)).fetchone()
            if row is None:
                return False
            store._event(cur, "renewed", claim.instance, claim.step, worker=claim.worker,
                         fence=claim.fence, lease_version=row[0])
            return True
        try:
            return store._write(do, points=False)
        except StoreUnavailable:
            return False  # as the real heartbeat: a lost connection must not end the thread


class FenceReset(Delegating):
    """A store whose every claim sets the lease version (the fencing token) to 1 instead of raising
    it: a lease generation reset on re-grant, so each holder of a step gets the same token."""

    def claim(self, instance: str, step: str, worker: str, *, expected_state_version: int,
              from_state: str, to_state: str, ttl_ms: float, reset_attempt: bool = False) -> Claim | None:
        store = self.inner
        if not isinstance(store, SqlStore):
            raise StoreError(f"a fence reset needs an SQL store, not {type(store).__name__}")
        if not states.allowed(from_state, to_state):
            raise StoreError(f"illegal claim {from_state} -> {to_state} for {instance}:{step}")
        attempt_sql = "1" if reset_attempt else "attempt + 1"

        def do(cur: Any) -> Claim | None:
            row = cur.execute(store._q(
                "UPDATE {steps} SET owner_worker = ?, lease_version = 1, "
                "expires_at = {now} + ?, heartbeat_at = {now}, progress_at = {now}, "
                f"state = ?, state_version = state_version + 1, attempt = {attempt_sql} "
                "WHERE instance = ? AND step = ? AND state_version = ? AND state = ? "
                "AND (owner_worker IS NULL OR expires_at < {now}) "
                "RETURNING lease_version, state_version, attempt"),
                (worker, ttl_ms / 1000.0, to_state, instance, step, expected_state_version,
                 from_state)).fetchone()
            if row is None:
                return None
            fence, sv, attempt = row
            store._event(cur, vocab.CLAIMED, instance, step, worker=worker, from_state=from_state,
                         to_state=to_state, state_version=sv, fence=fence, lease_version=fence,
                         attempt=attempt)
            return Claim(instance, step, worker, fence, sv, attempt, from_state, to_state)
        return store._write(do)


# ---------------------------------------------------------------------------------------------
# worker mutants


class RandomRequestId(ReferenceWorker):
    """Sends a fresh request id per attempt instead of the step's stable idempotency key."""

    def call(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, resource: str, key: str | None,
             params: dict[str, Any], ihash: str, compensation: bool) -> Answer | None:
        if key is not None:
            # What a random request id does, made reproducible: unique per attempt.
            key = f"req-{inst.id}-{spec.name}-{self.ctx.worker_id}-{claim.fence}"
        return super().call(inst, spec, claim, resource, key, params, ihash, compensation)


class NoFenceCheck(ReferenceWorker):
    """Commits without the lease version (and owner) in the compare-and-set.

    The state version it compares is the one the row holds when it writes, read in the same
    transaction (optimistic concurrency on a fresh read), so the version half stops nothing a
    stale lease holder does: the fence is what should have stopped it. Unlike ``no-cas``, the
    chain of versions stays unbroken, so only the fence check can see this one.
    """

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        self.store = UnfencedCommits(self.store)


class StateGuardedCommit(ReferenceWorker):
    """Commits with ``UPDATE ... WHERE step = ? AND state = 'running'``: the state it claimed is the
    only guard. Resumed after the new holder committed, its stale commit is refused (the state
    moved on); resumed between the new holder's claim and its commit, it lands."""

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        self.store = StateGuardedCommits(self.store)


class GivesUpOnHeldLease(NoFenceCheck):
    """Exits as soon as the only work left is a step whose lease another worker holds (a queue
    worker that skips locked rows and stops when none is left), with ``no-fence-check``'s stale
    commit: a frozen lease holder's step is taken over only by a worker started after its lease
    lapsed, and only such a takeover shows the stale commit."""

    def run(self) -> None:
        now, rows = self.store.snapshot()
        while plan(rows, now, self.ctx.workload) != WAIT:
            task = plan(rows, now, self.ctx.workload)
            if task == DONE:
                return
            assert isinstance(task, Task)
            self.execute(task)
            self.ctx.clock.moved()
            now, rows = self.store.snapshot()


class NoCas(ReferenceWorker):
    """Commits with a blind write: no expected state version in the compare-and-set.

    The fence half would still refuse a stale commit on its own, so it goes too; the blind write
    then lands on top of a newer version, which the version chain shows as a fork or a step back
    (``no-fence-check``, which compares a freshly read version, leaves the chain unbroken).
    """

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        self.store = BlindCommits(self.store)


class LocalClockLease(ReferenceWorker):
    """Judges whether its own lease is still valid by its local clock, then writes unfenced.

    The lease end is database time; this worker compares it with its own clock, which runs
    ``clock_behind_s`` behind the database's. A worker frozen past its lease (SIGSTOP, a GC pause)
    wakes up believing it still holds the lease and commits without the compare-and-set, on top
    of the worker that legitimately took over. With a correct clock it would see the lease expired
    and fall back to the fenced commit, which is refused.
    """

    clock_behind_s = 10.0

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        self._lease_until: dict[tuple[str, str, int], float] = {}

    def local_now(self) -> float:
        return self.ctx.clock.now() - self.clock_behind_s  # the run's time, 10 s slow

    def claim(self, row: dict[str, Any], compensation: bool) -> Claim | None:
        claim = super().claim(row, compensation)
        if claim is not None:
            _, rows = self.store.snapshot()
            for r in rows:
                if (r["instance"], r["step"]) == (claim.instance, claim.step) and r["expires_at"]:
                    self._lease_until[(claim.instance, claim.step, claim.fence)] = r["expires_at"]
        return claim

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        until = self._lease_until.get((claim.instance, claim.step, claim.fence))
        if until is None or self.local_now() >= until:
            return super().commit(claim, to_state, **detail)
        # "My lease is still valid, so I am the only writer": the write needs no compare-and-set.
        op = self.journal.invoke("commit", instance=claim.instance, step=claim.step, to_state=to_state,
                                 fence=claim.fence, expected_state_version=claim.state_version)
        ok = blind_commit(self.store, claim, to_state, **detail)
        self.journal.complete(op, "commit", "ok" if ok else "fail", instance=claim.instance,
                              step=claim.step, to_state=to_state, fence=claim.fence)
        return ok


class RetryUnsafe(ReferenceWorker):
    """Retries an activity that is not retry-safe when its outcome is unknown."""

    def decide(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, key: str | None,
               receipt_key: str, ihash: str, compensation: bool) -> str:
        action = super().decide(inst, spec, claim, key, receipt_key, ihash, compensation)
        return recovery.RETRY_SAME_ACTIVITY if action == recovery.MANUAL_REVIEW else action


class UnboundedRetry(ReferenceWorker):
    """Retries once the attempts are used up, instead of giving up."""

    def decide(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, key: str | None,
               receipt_key: str, ihash: str, compensation: bool) -> str:
        action = super().decide(inst, spec, claim, key, receipt_key, ihash, compensation)
        return recovery.RETRY_SAME_ACTIVITY if action == recovery.EXHAUSTED else action


class AutoResolveManual(ReferenceWorker):
    """Once idle, a background sweep marks steps in manual review succeeded, without an operator."""

    def run(self) -> None:
        while True:
            super().run()
            if not self.sweep():
                return

    def sweep(self) -> bool:
        _, rows = self.store.snapshot()
        moved = False
        for r in rows:
            if r["state"] == states.MANUAL:
                moved |= self.store.settle(r["instance"], r["step"],
                                           expected_state_version=r["state_version"],
                                           from_state=states.MANUAL, to_state=states.SUCCEEDED,
                                           worker=self.ctx.worker_id, reason="auto-resolved")
        return moved


class CommitBeforeCall(ReferenceWorker):
    """Records the step succeeded first, then makes the downstream call."""

    def work(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, compensation: bool) -> None:
        if not compensation and spec.resource is not None and claim.from_state == states.PENDING:
            if not self.commit(claim, states.SUCCEEDED):
                return
        super().work(inst, spec, claim, compensation)  # its own commit is then refused: harmless


class ReceiptIgnoresIntent(ReferenceWorker):
    """Recovery takes a receipt found under its key as its own, whatever intent it records."""

    def decide(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, key: str | None,
               receipt_key: str, ihash: str, compensation: bool) -> str:
        stored = self.store.receipt(receipt_key)
        if stored is not None and stored.get("intent_hash"):
            ihash = stored["intent_hash"]
        return super().decide(inst, spec, claim, key, receipt_key, ihash, compensation)


class TrustCheckpoint(ReferenceWorker):
    """Loads every stored checkpoint as it is: no format, integrity or definition check."""

    def load_instance(self, instance_id: str) -> checkpoint.Loaded:
        return checkpoint.Loaded(instance_id, checkpoint.OK)


class CommitBeforeReceipt(ReferenceWorker):
    """Commits a step's outcome first and records its receipt after the commit."""

    _deferred: tuple[Any, ...] | None = None

    def record_receipt(self, claim: Claim, key: str, ihash: str | None, status: str,
                       response: dict[str, Any]) -> None:
        self._deferred = (claim, key, ihash, status, response)  # written once the commit is done

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        ok = super().commit(claim, to_state, **detail)
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            super().record_receipt(*deferred)
        return ok


class StaleRenewals(ReferenceWorker):
    """Its heartbeat renews by instance alone (:class:`RenewByInstance`): a worker whose business
    thread hangs keeps renewing the step's lease after the monitor freed it and another worker
    took it (aegra #502, where the renewal also took the lease back from the new holder)."""

    def __init__(self, ctx: WorkerContext):
        ctx.heartbeat = Heartbeat(RenewByInstance(ctx.store), ctx.journal, ctx.timing)
        super().__init__(ctx)


class ResetFence(ReferenceWorker):
    """Claims through :class:`FenceReset`: every holder of a step gets fencing token 1."""

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        self.store = FenceReset(self.store)


class NoHeartbeatProgress(ReferenceWorker):
    """The monitor trusts heartbeats alone: a live heartbeat means a healthy worker.

    So it never flags a lease: one whose heartbeat goes on is healthy by its rule, and one whose
    heartbeat stopped expires and is claimed again anyway.
    """

    def monitor(self) -> None:
        return None


class FreshCompensationKey(ReferenceWorker):
    """Undoes a step under a new idempotency key on each retry of the compensation (a refund path
    that builds its key from the attempt): the first attempt's key is the stable one, so only a
    compensation retried after a crash sends another."""

    def key(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, compensation: bool) -> str | None:
        key = super().key(inst, spec, claim, compensation)
        if compensation and key is not None and claim.attempt > 1:
            return f"{key}:retry-{claim.attempt}"
        return key


class RepriceOnRecovery(ReferenceWorker):
    """Prices the charge again when it recovers a step (the amount plus a 4% surcharge, as a
    worker that reads the current price list on a retry): the replayed call carries another amount
    than the step's, under the right key."""

    def call(self, inst: InstanceSpec, spec: StepSpec, claim: Claim, resource: str, key: str | None,
             params: dict[str, Any], ihash: str, compensation: bool) -> Answer | None:
        if claim.attempt > 1 and isinstance(params.get("amount"), int):
            params = {**params, "amount": params["amount"] * 104 // 100}
        return super().call(inst, spec, claim, resource, key, params, ihash, compensation)


def _runner(cls: type[ReferenceWorker]) -> Target:
    def target(ctx: WorkerContext) -> None:
        cls(ctx).run()

    target.__name__ = target.__qualname__ = f"run_{cls.__name__}"
    target.__doc__ = cls.__doc__
    return target


# ---------------------------------------------------------------------------------------------
# the zoo

_ZOO = (
    Mutant("random-request-id",
           "a new idempotency key on every attempt instead of the step's stable key, so the "
           "downstream cannot tell a retry from a new charge",
           "no_duplicate_effects", _runner(RandomRequestId), "A@charge.after_call:kill"),
    Mutant("no-fence-check",
           "commits without the lease version (the fence) or owner in the compare-and-set, and "
           "compares the state version it reads just before writing, not the claim's: the stale "
           "worker's commit lands on top of its successor's as the next version, so only the "
           "fence check can see it",
           "stale_writes_rejected", _runner(NoFenceCheck), "A@charge.after_call:1*pause"),
    Mutant("local-clock-lease",
           "judges its own lease by its local clock (10 s behind database time) and, believing "
           "the lease still valid, commits without the compare-and-set after it was frozen past "
           "the lease",
           "stale_writes_rejected", _runner(LocalClockLease), "A@charge.after_call:1*pause"),
    Mutant("retry-unsafe",
           "retries a legacy activity whose outcome is unknown instead of sending it to manual "
           "review",
           "no_duplicate_effects", _runner(RetryUnsafe), "A@notify.after_call:kill"),
    Mutant("auto-resolve-manual",
           "a background sweep moves steps in manual review to succeeded by itself, without an "
           "operator event",
           "manual_stable", _runner(AutoResolveManual), "A@notify.after_call:kill"),
    Mutant("commit-before-call",
           "marks the step succeeded before the downstream call, so a crash in between (or a "
           "failed call) leaves a success with no effect",
           "effects_accounted", _runner(CommitBeforeCall), "A@charge.before_call:kill"),
    Mutant("no-cas",
           "commits with a blind write: no state version, fence or owner in the compare-and-set "
           "(the fence alone would still refuse a stale commit, so it goes too), and the version "
           "it writes is the claim's plus one, so the stale write steps the chain back",
           "version_chain", _runner(NoCas), "A@charge.after_call:1*pause"),
    Mutant("unbounded-retry",
           "ignores max attempts: a step whose attempts are used up is retried again; the "
           "schedule kills the third attempt of the flaky reservation (two 503s first) after "
           "its claim, with one worker so the hit count is exact",
           "retry_budget", _runner(UnboundedRetry), "A@reserve.after_claim#7:kill", workers=1),
    Mutant("downstream-ignores-intent",
           "the downstream replays the stored result for a reused key with another intent, "
           "instead of answering 422",
           "intent_conflict", reference, "", downstream=MappingProxyType({"ignore_intent": True})),
    Mutant("no-heartbeat-progress",
           "the stuck-worker monitor trusts heartbeats alone, so a worker whose business thread "
           "hangs while its heartbeat goes on holds its lease forever",
           "stuck_detected", _runner(NoHeartbeatProgress), "A@charge.heartbeat:hang", bound_s=3.0),
    Mutant("receipt-ignores-intent",
           "recovery takes a receipt found under the step's key as its own without comparing "
           "the intent hash, so an amendment that reuses the charge's key is recorded as done",
           "effects_accounted", _runner(ReceiptIgnoresIntent), "A@amend.before_call:kill"),
    Mutant("trust-checkpoint",
           "loads every stored checkpoint without verifying it, so an order whose checkpoint was "
           "damaged after its hash was taken is reserved and charged instead of sent to manual "
           "review (in the default workload, order-5's checkpoint is corrupt)",
           "checkpoints_honoured", _runner(TrustCheckpoint), ""),
    Mutant("renew-by-instance",
           "the heartbeat renews a step's lease by instance and step alone, not by holder and "
           "fence, so a hung worker's heartbeat keeps renewing the lease after the monitor freed "
           "it and another worker took it (aegra #502)",
           "lease_fenced", _runner(StaleRenewals), "A@charge.heartbeat:hang",
           # The stale renewal lands while the new holder works: heartbeats must be frequent next
           # to a step's milliseconds of work, on either clock (the run's time flows at the real
           # rate while a worker works).
           timing={"lease_ttl_ms": 120.0, "heartbeat_ms": 5.0, "stuck_bound_ms": 300.0,
                   "poll_ms": 2.0}),
    Mutant("fence-reset",
           "every claim sets the step's lease version to 1 instead of raising it, so the worker "
           "that takes over after a crash gets the same fencing token as the one it replaces "
           "(semaprax #192)",
           "fence_rises", _runner(ResetFence), "A@charge.after_call:kill"),
    Mutant("state-guarded-commit",
           "commits with UPDATE ... WHERE step = ? AND state = 'running': no fence, no owner, no "
           "version; a stale worker resumed after the new holder committed is refused, one resumed "
           "between the new holder's claim and its commit lands on top of it",
           "stale_writes_rejected", _runner(StateGuardedCommit),
           "A@charge.after_call:1*pause(until=after_claim)"),
    Mutant("gives-up-on-held-lease",
           "its workers exit as soon as the only work left is a step whose lease another worker "
           "holds, and it commits without the fence (as no-fence-check): the frozen holder's step "
           "is taken over only by a worker started after the lease lapsed",
           "stale_writes_rejected", _runner(GivesUpOnHeldLease), "A@charge.after_call:1*pause"),
    Mutant("commit-before-receipt",
           "commits a step's outcome before recording its receipt, so a crash in between leaves "
           "a success that no receipt explains; every keyed success shows it, no fault needed",
           "receipt_first", _runner(CommitBeforeReceipt), ""),
    Mutant("fresh-compensation-key",
           "retries a compensation under a new idempotency key (built from the attempt), so a "
           "release whose first attempt was applied before its worker died is applied again; "
           "the schedule kills A after the call of the declined order's compensation, the third "
           "hit of reserve.after_call, which only the matrix's path exploration (or --depth 2) "
           "reaches",
           "no_duplicate_effects", _runner(FreshCompensationKey), "A@reserve.after_call#3:kill"),
    Mutant("renew-by-id-owned",
           "a queue that keeps its jobs in a table of its own renews a job's lease by job id alone "
           "(UPDATE jobs SET lease_until = ? WHERE id = ? AND state = 'running'): back from a pause "
           "while the new holder holds the job, its heartbeat renews that holder's lease as its "
           "own; back after the new holder acknowledged the job, it finds nothing to renew, so only "
           "a pause that resumes in the takeover window shows it",
           "lease_fenced", zoo_queue.renew_by_id, "A@charge.before_ack:1*pause(until=taken)",
           reference="killpoint.harness.zoo_queue:fenced_renewal"),
    Mutant("reprice-on-recovery",
           "prices the charge again when it recovers it: the replayed call carries the amount "
           "plus 4% under the step's own key, so the effect applied differs from the step's intent",
           "effects_match_intent", _runner(RepriceOnRecovery), "A@charge.before_call:kill"),
)

# name -> mutant; read-only so no caller can change the zoo for others.
MUTANTS: Mapping[str, Mutant] = MappingProxyType({m.name: m for m in _ZOO})


def downstream_for(target: object) -> dict[str, Any]:
    """The downstream overrides a target name asks for (only ``mutant:NAME`` targets ask)."""
    mutant = _named(target)
    return dict(mutant.downstream) if mutant is not None else {}


def overrides_for(target: object) -> dict[str, Any]:
    """RunConfig fields (other than workers) a ``mutant:NAME`` target needs, e.g. a tighter bound.
    Its timings are not among them: a run of the mutant takes them unless it is given its own
    (:func:`timing_for`, applied by :class:`RunConfig` itself)."""
    mutant = _named(target)
    return {"bound_s": mutant.bound_s} if mutant is not None and mutant.bound_s is not None else {}


def timing_for(target: object) -> Timing | None:
    """The timings a ``mutant:NAME`` target runs with unless given others (None: the defaults)."""
    mutant = _named(target)
    return Timing(**mutant.timing) if mutant is not None and mutant.timing is not None else None


def _named(target: object) -> Mutant | None:
    """The mutant a ``mutant:NAME`` target names (None: another target, or no such mutant)."""
    return MUTANTS.get(target.split(":", 1)[1]) if isinstance(target, str) and target.startswith("mutant:") else None


__all__ = ["MUTANTS", "BlindCommits", "Delegating", "Mutant", "blind_commit", "downstream_for",
           "overrides_for", "timing_for"]
