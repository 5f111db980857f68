"""Time per scenario on the library targets, beside the reference worker measured at the same time.

    python benchmarks/libs.py [--runs N] [--store postgresql://...]

One scenario is ``A@charge.after_call:kill`` on the keyed target: the worker is killed after the
charge's call, a replacement recovers through the library's own path, the history is merged and
judged. For each target it prints the median and the 90th percentile of the wall time of a run, and
the median CPU time a run costs (the harness and every worker process it reaped), which does not
grow with the machine's load as the wall time does. The reference worker on the ``single``
workload runs interleaved with them, so the ratio to it holds on a loaded machine too. procrastinate
needs PostgreSQL (``--store`` or ``KILLPOINT_PG_DSN``), the task queues a Redis broker
(``KILLPOINT_REDIS_URL``); a library that is not installed is skipped. ``--only`` picks targets.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import sys

from killpoint.chaos.schedule import parse
from killpoint.harness.run import RunConfig, Session

SCHEDULE = "A@charge.after_call:kill"
TARGETS = (("reference", "single", None), ("dbos:keyed", None, "dbos"), ("langgraph:keyed", None, "langgraph"),
           ("langgraph:keyed:sync", None, "langgraph"), ("procrastinate:keyed", None, "procrastinate"),
           ("celery:keyed", None, "celery"), ("celery:keyed:amqp", None, "celery"),
           ("dramatiq:keyed", None, "dramatiq"), ("arq:keyed", None, "arq"), ("rq:keyed", None, "rq"),
           ("huey:keyed", None, "huey"))


def cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--store", default="sqlite")
    p.add_argument("--only", default="", help="comma-separated targets (the reference always runs)")
    args = p.parse_args()
    only = set(filter(None, args.only.split(",")))
    targets = [(t, w) for t, w, lib in TARGETS if (lib is None or importlib.util.find_spec(lib) is not None)
               and (not only or t in only or t == "reference")]
    if not (args.store.startswith("postgres") or os.environ.get("KILLPOINT_PG_DSN")):
        targets = [(t, w) for t, w in targets if not t.startswith("procrastinate")]
    from killpoint.harness.targets import declared

    for t, _ in targets:
        declared(t)  # import each library once, before any run forks
    wall: dict[str, list[float]] = {t: [] for t, _ in targets}
    used: dict[str, list[float]] = {t: [] for t, _ in targets}
    load = []
    with Session() as session:
        for t, w in targets:  # warm-up: templates, schemas, first imports
            session.run(RunConfig(schedule=parse(SCHEDULE, points=frozenset(declared(t).points)), target=t, workload=w))
        for _ in range(args.runs):
            for t, w in targets:
                before = cpu()
                r = session.run(RunConfig(schedule=parse(SCHEDULE, points=frozenset(declared(t).points)), target=t,
                                          workload=w, store=args.store))
                used[t].append(cpu() - before)
                if r.valid is not True:
                    print(f"{t}: run not valid: {r.verdict.unknown_reasons}", file=sys.stderr)
                    return 1
                wall[t].append(r.duration_s)
            load.append(os.getloadavg()[0])
    ref = statistics.median(wall["reference"])
    print(f"{args.runs} runs each of {SCHEDULE}, store {args.store.split('@')[-1]}, "
          f"load average {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores")
    print(f"{'target':24} {'median':>9} {'p90':>9} {'cpu':>9} {'x reference':>12}")
    for t, _ in targets:
        ws = sorted(wall[t])
        p90 = ws[int(0.9 * (len(ws) - 1))]
        med = statistics.median(ws)
        print(f"{t:24} {med * 1000:8.0f}ms {p90 * 1000:8.0f}ms {statistics.median(used[t]) * 1000:8.0f}ms "
              f"{med / ref:11.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
