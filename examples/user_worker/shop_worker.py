"""A small user worker, written against the worker context alone: the kind of code killpoint tests.

It charges orders. Each step goes through the four moves of the step protocol -- claim a lease,
call the payment service with a stable idempotency key and the fencing token, record the receipt,
commit with compare-and-set -- and each move is marked with ``ctx.point(...)``, so killpoint can
crash the worker exactly there. A worker that takes over a step somebody else started first finds
out what happened (its own receipt, else the payment service's, by key), and only calls again when
nothing did.

``run`` is the correct worker. ``run_without_fencing`` makes one classic mistake -- its commit
trusts the lease it took earlier instead of comparing fence and version -- so the tests can show
killpoint catching it.

Both are declared with ``@killpoint.target``: the crash points they mark (so the matrix schedules
exactly these, and a typo in ``ctx.point`` fails at once) and the workload they run, one order with
one charge. They keep their state in killpoint's own store (``ctx.store``), so every invariant judges
them; a worker with a store of its own says ``owns_state=True`` (see ``examples/pg_queue``).
"""

from __future__ import annotations

from typing import Any

import killpoint
from killpoint import WorkerContext
from killpoint.harness.mutants import blind_commit

# States a worker may pick a step up from: never started, or started by a worker that may be dead.
CLAIMABLE = ("pending", "running")
FINISHED = ("succeeded", "failed", "manual_intervention", "cancelled", "compensated")
# Where this worker can be crashed, in the order it passes them on one step.
POINTS = ("before_claim", "after_claim", "heartbeat", "before_call", "in_call", "after_call",
          "before_receipt", "after_receipt", "before_commit", "after_commit")


@killpoint.target(points=POINTS, workload="single")
def run(ctx: WorkerContext) -> None:
    """The target: work until every step in the store is finished."""
    Shop(ctx, fenced=True).work()


@killpoint.target(points=POINTS, workload="single")
def run_without_fencing(ctx: WorkerContext) -> None:
    """The same worker with one bug: its commits are not compared against the current lease."""
    Shop(ctx, fenced=False).work()


class Shop:
    def __init__(self, ctx: WorkerContext, *, fenced: bool) -> None:
        self.ctx = ctx
        self.fenced = fenced

    def work(self) -> None:
        ctx = self.ctx
        while True:
            now, rows = ctx.store.snapshot()  # database time and every step row, in one read
            if all(row["state"] in FINISHED for row in rows):
                return
            free = [row for row in rows if row["state"] in CLAIMABLE
                    and (row["owner_worker"] is None or row["expires_at"] < now)]
            if not free:
                # Somebody holds a lease. A heartbeat only proves its holder is alive; flag_stuck
                # frees a lease whose step made no progress for too long, so we can take it over.
                ctx.store.flag_stuck(ctx.timing.stuck_bound_ms, ctx.worker_id)
                ctx.clock.sleep(ctx.timing.poll_ms / 1000.0)  # the run's clock: time can jump past it
                continue
            row = free[0]
            with ctx.at(row["instance"], row["step"]):  # lets a schedule name the step: A@charge.after_call
                self.step(row)

    def step(self, row: dict[str, Any]) -> None:
        ctx = self.ctx
        spec = ctx.workload.instance(row["instance"]).step(row["step"])
        # instance:step:resource-version, the same on every retry (every step of "single" calls out)
        key, resource = spec.key(row["instance"]), spec.resource
        assert key is not None and resource is not None, "this worker only runs steps that call out"
        ctx.point("before_claim")
        claim = ctx.store.claim(row["instance"], row["step"], ctx.worker_id,
                                expected_state_version=row["state_version"], from_state=row["state"],
                                to_state="running", ttl_ms=ctx.timing.lease_ttl_ms)
        if claim is None:
            return  # another worker was faster
        ctx.point("after_claim")
        ctx.heartbeat.hold(claim)  # renews the lease from a thread of its own while we work
        try:
            ctx.point("heartbeat")
            outcome = self.earlier_outcome(claim, key) if claim.attempt > 1 else None
            if outcome is None:
                ctx.point("before_call")
                op = ctx.journal.invoke("call", instance=claim.instance, step=claim.step, key=key,
                                        resource=resource, fence=claim.fence, attempt=claim.attempt)
                answer = ctx.downstream.call(
                    resource, key=key, params=spec.params, fence=claim.fence,
                    fence_scope=f"{claim.instance}:{claim.step}",
                    meta={"instance": claim.instance, "step": claim.step, "worker": ctx.worker_id},
                    before_read=lambda: ctx.point("in_call"))  # applied, answer not yet read
                ctx.journal.complete(op, "call", "ok" if answer.status < 300 else "fail",
                                     instance=claim.instance, step=claim.step, status=answer.status)
                ctx.point("after_call")
                if answer.status == 409:
                    return  # a newer fence exists, or the first call is still in flight: not ours now
                outcome = "succeeded" if answer.status < 300 else "failed_permanent"
                ctx.point("before_receipt")
                ctx.store.record_receipt(claim, key, None, outcome, answer.body)
                ctx.point("after_receipt")
            ctx.point("before_commit")
            state = "succeeded" if outcome == "succeeded" else "failed"
            if self.fenced:
                ctx.store.commit(claim, state)  # compare-and-set on state version, fence and owner
            else:
                blind_commit(ctx.store, claim, state)  # the bug: an UPDATE that compares nothing
            ctx.point("after_commit")
        finally:
            ctx.heartbeat.release()

    def earlier_outcome(self, claim: Any, key: str) -> str | None:
        """What an earlier, crashed attempt achieved: our own receipt, else the payment service's,
        which we record as our receipt before anything is committed on its strength."""
        receipt = self.ctx.store.receipt(key)
        if receipt is not None:
            return str(receipt["status"])
        remote = self.ctx.downstream.receipt(key)
        if remote is not None and remote["status"] < 500:
            outcome = "succeeded" if remote["status"] < 300 else "failed_permanent"
            self.ctx.store.record_receipt(claim, key, remote.get("intent_hash"), outcome,
                                          remote.get("response") or {})
            return outcome
        return None  # nothing happened downstream: calling again with the same key is safe
