"""``killpoint matrix``: every single-fault schedule of the workload, each judged by every invariant.

Depth 1 kills worker A at each point of each step (hangs it at the heartbeat) and, with the
``pause`` action, also freezes A past its lease at each point where it holds one, so that another
worker takes over and A wakes up stale: the lease-takeover exercise at every point. On a PostgreSQL
store, ``--actions terminate`` ends A's database sessions once at each point of each step, including
the store's own ``before_db_commit`` and ``in_db_commit`` in each write transaction of an attempt
(claim, receipt, commit): there a lost connection leaves the transaction rolled back, or committed
without A knowing, and recovery must settle it.

``--depth 2`` runs every ordered pair of faults instead: A crashes at one point, then a second
crash lands either on worker B (``workers``: the worker that recovers dies too) or on A again after
it restarted under its own identity (``hits``: the same identity crashes twice). By default both
faults sit on the same step, which is where a second crash meets the first one's recovery, and the
steps are those more than one instance runs; that is ``steps x points x points x forms`` runs (600
on the default workload, about two and a half minutes on two cores).
``--cross-steps`` pairs every step with every step (the workers form only), and ``--steps``,
``--points`` and ``--forms`` narrow the matrix.
"""

from __future__ import annotations

import argparse
import sys

from killpoint.chaos.points import DB_POINTS, ORDERED_POINTS
from killpoint.chaos.schedule import Fault, Schedule
from killpoint.chaos.actions import parse as parse_actions
from killpoint.harness.commands.common import (Summary, add_common, finish, parse_points, parse_steps,
                                               progress_for, run_config, target_points, workload_of)
from killpoint.harness.run import Session

HELP = ("run every single-fault schedule (each point x each step, killed or paused past its lease), "
        "or with --depth 2 every ordered pair of crashes, and check every invariant")
FORMS = ("workers", "hits")
# The order a worker hits the points of one attempt in (heartbeat right after the claim).
HIT_ORDER = ("before_claim", "after_claim", "heartbeat", "before_call", "in_call", "after_call",
             "before_receipt", "after_receipt", "before_commit", "after_commit")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--points", default=None,
                   help="comma-separated crash points (default: all but the PostgreSQL store's "
                        "before_db_commit and in_db_commit, which --actions terminate adds)")
    p.add_argument("--steps", default=None, help="comma-separated step names (default: all)")
    p.add_argument("--actions", default="kill,pause",
                   help="with --depth 1: kill (SIGKILL at every point, hang at the heartbeat) and/or "
                        "pause (SIGSTOP past the lease at every point where a lease is held, then "
                        "resume: the stale-worker case), and on a postgresql:// store terminate "
                        "(pg_terminate_backend of the worker's sessions at every point and inside "
                        "the store's COMMIT); default kill,pause")
    p.add_argument("--depth", type=int, choices=(1, 2), default=1,
                   help="1: every single crash (default); 2: every ordered pair of crashes")
    p.add_argument("--forms", default=",".join(FORMS),
                   help="with --depth 2: workers (A then B), hits (A twice, restarted under its "
                        "own identity), or both (default)")
    p.add_argument("--cross-steps", action="store_true",
                   help="with --depth 2: pair faults on different steps too (workers form only)")


def single_crash_schedules(step_names, points) -> list[Schedule]:
    """Worker A faulted once at each point of each step: ``kill``, or ``hang`` for the heartbeat."""
    out = []
    for step in step_names:
        for point in points:
            action = "hang" if point == "heartbeat" else "kill"
            out.append(Schedule((Fault("A", point, parse_actions(action), step),)))
    return out


# The points at which the faulted worker holds a lease: a pause there makes it a stale worker.
LEASE_HELD = ("after_claim", "before_call", "in_call", "after_call", "before_receipt", "after_receipt",
              "before_commit")
ACTIONS = ("kill", "pause", "terminate")
# At a db point, the hits ``terminate`` lands on: the write transactions of A's first attempt at a
# step -- its claim, its receipt and its commit.
DB_HITS = (1, 2, 3)


def single_fault_schedules(step_names, points, actions=("kill", "pause"),
                           terminate_points=None) -> list[Schedule]:
    """The single-crash schedules (``kill``); with ``pause``, worker A frozen once past its lease
    at every point where it holds one, then resumed after another worker moved the step on; with
    ``terminate``, A's database sessions ended once at every point of ``terminate_points``
    (default ``points``), at a db point in each transaction of ``DB_HITS``."""
    out = single_crash_schedules(step_names, points) if "kill" in actions else []
    if "pause" in actions:
        for step in step_names:
            for point in points:
                if point in LEASE_HELD:
                    out.append(Schedule((Fault("A", point, parse_actions("1*pause"), step),)))
    if "terminate" in actions:
        for step in step_names:
            for point in (points if terminate_points is None else terminate_points):
                for hit in (DB_HITS if point in DB_POINTS else (1,)):
                    out.append(Schedule((Fault("A", point, parse_actions("1*terminate"), step, hit),)))
    return out


def _action(point: str) -> str:
    # Once, said in the schedule itself: the pair's text then reads the same whatever the
    # harness's rule for spent faults (a hang, like a kill, is not inherited by a restart).
    return "1*hang" if point == "heartbeat" else "kill"


def _fault(worker: str, step: str, point: str, hit: int = 1) -> Fault:
    return Fault(worker, point, parse_actions(_action(point)), step, hit)


def double_crash_schedules(step_names, points, *, forms=FORMS,
                           cross_steps: bool = False) -> list[tuple[Schedule, float]]:
    """Every ordered pair of faults, each with the restart rule it needs (``same_identity``).

    ``workers``: ``A@s1.p1`` then ``B@s2.p2`` (B starts once A's fault fired). ``hits``:
    ``A@s.p1`` then ``A@s.p2`` again, with every killed worker restarted under its own identity,
    so the restarted A takes the second crash; when A passes ``p2`` before (or at) ``p1`` in an
    attempt, the second fault waits for hit #2 so that it lands after the first. A pair whose
    second fault is never reached (the other worker did that work) is unknown, never valid.
    The ``hits`` form has no pair after a hang at the heartbeat: a hung worker is never killed
    and restarted (the harness ends it only once the run is done), so A could never crash again.
    """
    out: list[tuple[Schedule, float]] = []
    for s1 in step_names:
        for p1 in points:
            first = _fault("A", s1, p1)
            if "workers" in forms:
                for s2 in (step_names if cross_steps else (s1,)):
                    for p2 in points:
                        out.append((Schedule((first, _fault("B", s2, p2))), 0.5))
            if "hits" in forms and _action(p1) != "1*hang":
                for p2 in points:
                    hit = 2 if HIT_ORDER.index(p2) <= HIT_ORDER.index(p1) else 1
                    out.append((Schedule((first, _fault("A", s1, p2, hit))), 1.0))
    return out


def repeated_steps(workload) -> tuple[str, ...]:
    """The steps more than one instance runs: the default steps of ``--depth 2``.

    After a crash, recovery of a step passes only the points it needs (a receipt found means no
    call, no receipt, no second commit point), so a second fault at the same step is reached on a
    later instance that runs the step afresh. A step only one instance runs (the amendment) has no
    later instance, so most of its pairs could never fire; name it with ``--steps`` to run them.
    """
    counts: dict[str, int] = {}
    for inst in workload.instances:
        for step in inst.steps:
            counts[step.name] = counts.get(step.name, 0) + 1
    return tuple(name for name in workload.step_names if counts[name] > 1) or workload.step_names


def run(args: argparse.Namespace) -> int:
    from killpoint.harness.commands.common import BadInput, redact, shown

    points = target_points(args, args.points)
    workload = workload_of(args)
    steps = parse_steps(args.steps, workload.step_names)
    if args.steps is None and args.depth == 2:
        steps = repeated_steps(workload)
    if args.depth == 1:
        actions = tuple(a.strip() for a in args.actions.split(",") if a.strip())
        bad = [a for a in actions if a not in ACTIONS]
        if bad or not actions:
            raise BadInput(f"--actions: unknown action {', '.join(map(shown, bad)) or shown(args.actions)}; "
                           f"use any of {', '.join(ACTIONS)}")
        if "terminate" in actions and not str(args.store).startswith(("postgresql://", "postgres://")):
            raise BadInput(f"--actions terminate: ending a worker's database sessions needs a "
                           f"postgresql:// store, not --store {redact(args.store)}")
        # Unless --points narrows it, terminate also runs inside the PostgreSQL store's COMMIT.
        # (for a target that declares its own points: those, and the store's own)
        terminate_points = points if args.points is not None else \
            parse_points(None, default=ORDERED_POINTS) if set(points) <= set(ORDERED_POINTS) \
            else points + DB_POINTS
        configs = [run_config(args, s)
                   for s in single_fault_schedules(steps, points, actions, terminate_points)]
    else:
        forms = tuple(f.strip() for f in args.forms.split(",") if f.strip())
        bad = [f for f in forms if f not in FORMS]
        if bad or not forms:
            raise BadInput(f"--forms: unknown form {', '.join(map(shown, bad)) or shown(args.forms)}; "
                           f"use workers, hits or both")
        pairs = double_crash_schedules(steps, points, forms=forms, cross_steps=args.cross_steps)
        configs = [run_config(args, s, same_identity=same) for s, same in pairs]
        if not args.json:
            print(f"killpoint matrix --depth 2: {len(configs)} runs (steps {', '.join(steps)} x "
                  f"{len(points)} x {len(points)} points"
                  f"{' x ' + str(len(steps)) + ' steps' if args.cross_steps else ''}, forms "
                  f"{', '.join(forms)}); choose with --steps, --points or --forms", file=sys.stderr)
    summary = Summary()
    progress = progress_for(args, len(configs), f"killpoint matrix{' --depth 2' if args.depth == 2 else ''}")
    with Session() as session:
        for config in configs:
            progress.step(str(config.schedule))
            result = session.run(config)
            summary.results.append(result)
            progress.step(str(config.schedule), result)
    progress.close()
    return finish(args, summary, f"killpoint matrix{' --depth 2' if args.depth == 2 else ''}")
