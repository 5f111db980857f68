"""``killpoint matrix``: every single-crash schedule of the workload, each judged by every invariant."""

from __future__ import annotations

import argparse

from chaos.points import POINTS
from chaos.schedule import Fault, Schedule
from chaos.actions import parse as parse_actions
from harness.commands.common import Progress, Summary, add_common, finish, parse_points, run_config
from harness.run import Session
from harness.workload import WORKLOADS

HELP = "run every single-crash schedule (each point x each step) and check every invariant"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--points", default=None,
                   help="comma-separated crash points (default: all of them)")
    p.add_argument("--steps", default=None, help="comma-separated step names (default: all)")


def single_crash_schedules(step_names, points) -> list[Schedule]:
    """Worker A faulted once at each point of each step: ``kill``, or ``hang`` for the heartbeat."""
    out = []
    for step in step_names:
        for point in points:
            action = "hang" if point == "heartbeat" else "kill"
            out.append(Schedule((Fault("A", point, parse_actions(action), step),)))
    return out


def run(args: argparse.Namespace) -> int:
    from harness.commands.common import BadInput

    points = parse_points(args.points, POINTS)
    if args.workload not in WORKLOADS:
        raise BadInput(f"--workload {args.workload!r}: known workloads are {', '.join(WORKLOADS)}")
    steps = WORKLOADS[args.workload](args.seed).step_names
    if args.steps:
        chosen = tuple(s.strip() for s in args.steps.split(",") if s.strip())
        bad = [s for s in chosen if s not in steps]
        if bad:
            raise BadInput(f"--steps: unknown step {', '.join(map(repr, bad))}; "
                           f"the workload's steps are {', '.join(steps)}")
        steps = chosen
    schedules = single_crash_schedules(steps, points)
    configs = [run_config(args, s) for s in schedules]
    summary = Summary()
    progress = Progress(len(configs), enabled=not args.json)
    with Session() as session:
        for config in configs:
            progress.step(str(config.schedule))
            result = session.run(config)
            summary.results.append(result)
            progress.step(str(config.schedule), result)
    progress.close()
    return finish(args, summary, "killpoint matrix")
