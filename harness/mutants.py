"""The mutant zoo: the reference worker (or downstream) with exactly one rule broken.

A verifier is only worth what it catches. Each mutant breaks one rule of DESIGN sections 3 and 5,
names the invariant that must catch it, and carries the schedule (at most two faults) that shows
it. ``killpoint selftest`` runs them all; a mutant that survives means a checker went blind.

The broken workers are :mod:`killpoint.harness.mutant_workers` (each overrides the one method of
:class:`~killpoint.harness.worker.ReferenceWorker` its rule lives in), the broken stores they wrap
:mod:`killpoint.harness.mutant_stores`; this module is the catalogue. :func:`blind_commit`,
:class:`Delegating` and :class:`BlindCommits` are re-exported here, where users import them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from killpoint.harness import zoo_queue
from killpoint.harness.mutant_stores import BlindCommits, Delegating, blind_commit
from killpoint.harness.mutant_workers import (AutoResolveManual, CommitBeforeCall, CommitBeforeReceipt,
                                              FreshCompensationKey, GivesUpOnHeldLease, LocalClockLease, NoCas,
                                              NoFenceCheck, NoHeartbeatProgress, RandomRequestId, ReceiptIgnoresIntent,
                                              RepriceOnRecovery, ResetFence, RetryUnsafe, StaleRenewals,
                                              StateGuardedCommit, TrustCheckpoint, UnboundedRetry)
from killpoint.harness.worker import ReferenceWorker, Timing, WorkerContext, reference

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
