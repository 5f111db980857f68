"""What reading RQ's own record (``history()``) costs a run of an ``rq:*`` target.

    python benchmarks/queue_history.py [--target rq:keyed] [--runs N]

Runs ``A@charge.after_call:kill`` N times each way, interleaved: as the target is (``history()`` and
``final_states()`` from RQ's record: the job hash, the results stream, the executions registry), and
as it was before (no ``history()``, ``final_states()`` from each job's status). Prints the CPU time
of the two hooks in the harness (``time.process_time`` around each call: precise), and the CPU a
whole run costs either way (the harness and every worker process it reaped, user + system: what
``benchmarks/libs.py`` prints), which also holds the judging of the extra store events but is too
noisy on a shared machine to show a millisecond. Redis's own CPU for the extra commands is not in
the process tree (a shared server); the commands are one pipelined round trip per hook call.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from typing import Any

from killpoint.chaos.schedule import parse
from killpoint.harness.declaration import Target
from killpoint.harness.run import RunConfig, Session
from killpoint.harness.targets import declared

# RQ's job statuses as the targets read them before history() (final_states() from the status alone)
BEFORE = {"finished": "succeeded", "failed": "failed", "started": "running", "stopped": "failed",
          "canceled": "cancelled", "queued": "pending", "deferred": "pending", "scheduled": "pending"}


def tree_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="rq:keyed", choices=("rq:keyed", "rq:naive"))
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    from killpoint.harness.libs import rq as module

    base = declared(args.target)
    hooks_cpu = [0.0]

    def timed(fn: Any) -> Any:
        def hook(run: Any) -> Any:
            start = time.process_time()
            try:
                return fn(run)
            finally:
                hooks_cpu[0] += time.process_time() - start
        return hook

    def by_status(run: Any) -> dict[tuple[str, str], str]:
        statuses = module._statuses(run.state)
        return {where: BEFORE.get(statuses.get(job_id) or "queued", "pending")
                for job_id, where in run.state["tasks"].items()}

    common = {name: base.hook(name) for name in ("setup", "done", "teardown")}
    now = Target(base.fn, points=base.points, owns_state=True, workload=base.workload, name=args.target,
                 history=timed(module.history), final_states=timed(module.final_states), **common)
    before = Target(base.fn, points=base.points, owns_state=True, workload=base.workload, name=args.target,
                    final_states=timed(by_status), **common)
    schedule = parse("A@charge.after_call:kill", points=frozenset(base.points))
    cpu: dict[str, list[float]] = {"history": [], "status": []}
    hooks: dict[str, list[float]] = {"history": [], "status": []}
    wall: dict[str, list[float]] = {"history": [], "status": []}
    with Session() as session:
        session.run(RunConfig(schedule=schedule, target=now))  # warm-up
        for _ in range(args.runs):
            for label, target in (("history", now), ("status", before)):
                hooks_cpu[0] = 0.0
                start = tree_cpu()
                r = session.run(RunConfig(schedule=schedule, target=target))
                cpu[label].append(tree_cpu() - start)
                hooks[label].append(hooks_cpu[0])
                wall[label].append(r.duration_s)
                if r.valid is not True:
                    print(f"{label}: run not valid: {r.verdict.unknown_reasons}")
                    return 1
    print(f"{args.runs} runs each of {schedule} on {args.target}, load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    for label, what in (("history", "history() + final_states() from RQ's record"),
                        ("status", "final_states() from the job statuses (before)")):
        q1, q2, q3 = statistics.quantiles(cpu[label], n=4)
        print(f"{what}: {statistics.median(hooks[label]) * 1000:.2f} ms in the harness (median); a run: "
              f"{q2 * 1000:.0f} ms of CPU (harness and reaped children; quartiles {q1 * 1000:.0f}-{q3 * 1000:.0f}), "
              f"{statistics.median(wall[label]):.2f} s of wall time (median)")
    # The workers poll while RQ's heartbeat expiry (whole seconds) runs out: a run's CPU follows its
    # wall time, which that rounding spreads over a second, far more than the hooks' milliseconds.
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
