"""The five-minute worker of the README: a complete worker on killpoint's own store."""

from typing import Any, Iterator

import killpoint
from killpoint import StepSpec, WorkerContext

POINTS = ("before_claim", "after_claim", "before_call", "in_call", "after_call",
          "before_receipt", "after_receipt", "before_commit", "after_commit")


def next_steps(ctx: WorkerContext,
               rows: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], StepSpec]]:
    """Each instance's first unfinished step: steps run in order, a failed one ends its instance."""
    state = {(row["instance"], row["step"]): row for row in rows}
    for instance in ctx.workload.instances:
        for step in instance.steps:
            row = state[(instance.id, step.name)]
            if row["state"] == "failed":
                break
            if row["state"] != "succeeded":
                yield row, step
                break


@killpoint.target(points=POINTS, workload="plain")
def worker(ctx: WorkerContext) -> None:
    while True:
        now, rows = ctx.store.snapshot()            # database time, every step row
        todo = list(next_steps(ctx, rows))
        if not todo:
            return                                  # every instance finished
        free = [(row, step) for row, step in todo   # nobody holds it, or its lease expired
                if row["owner_worker"] is None or row["expires_at"] < now]
        if not free:
            ctx.clock.sleep(ctx.timing.poll_ms / 1000)
            continue
        row, step = free[0]
        instance = row["instance"]
        with ctx.at(instance, step.name):           # schedules can name the step: A@reserve.after_call
            ctx.point("before_claim")
            claim = ctx.store.claim(instance, step.name, ctx.worker_id,
                                    expected_state_version=row["state_version"],
                                    from_state=row["state"], to_state="running",
                                    ttl_ms=ctx.timing.lease_ttl_ms)
            if claim is None:                       # another worker was faster
                continue
            ctx.point("after_claim")
            ctx.heartbeat.hold(claim)               # renews the lease while we work
            try:
                key = step.key(instance)            # the same key on every retry
                assert key and step.resource, "every step of 'plain' calls out with a key"
                ctx.point("before_call")
                answer = ctx.downstream.call(
                    step.resource, key=key, params=step.params, fence=claim.fence,
                    meta={"instance": instance, "step": step.name, "worker": ctx.worker_id},
                    before_read=lambda: ctx.point("in_call"))
                ctx.point("after_call")
                if answer.status == 409:            # a newer fence was seen: not ours any more
                    continue
                outcome = "succeeded" if answer.status < 300 else "failed"
                ctx.point("before_receipt")
                ctx.store.record_receipt(claim, key, None, outcome, answer.body)
                ctx.point("after_receipt")
                ctx.point("before_commit")
                ctx.store.commit(claim, outcome)    # refused when the lease moved on
                ctx.point("after_commit")
            finally:
                ctx.heartbeat.release()
