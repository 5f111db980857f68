"""The mutants' broken workers: the reference worker with exactly one rule broken.

Each subclasses :class:`~killpoint.harness.worker.ReferenceWorker` and overrides the one method its
rule lives in (``local-clock-lease`` needs two: the claim, where it learns its lease end, and the
commit, where it trusts it); a worker whose bug is in how it writes wraps its store with one of
:mod:`killpoint.harness.mutant_stores`. The zoo that names them, with the invariant that must catch
each and the schedule that shows it, is :mod:`killpoint.harness.mutants`.
"""

from __future__ import annotations

from typing import Any

from killpoint.harness import checkpoint, recovery, states
from killpoint.harness.downstream import Answer
from killpoint.harness.mutant_stores import (BlindCommits, FenceReset, RenewByInstance, StateGuardedCommits,
                                             UnfencedCommits, blind_commit)
from killpoint.harness.store.base import Claim
from killpoint.harness.worker import DONE, WAIT, Heartbeat, ReferenceWorker, Task, WorkerContext, plan
from killpoint.harness.workload import InstanceSpec, StepSpec


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
