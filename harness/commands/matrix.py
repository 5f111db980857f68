"""``killpoint matrix``: every single-fault schedule of the workload, each judged by every invariant.

Depth 1 kills worker A at each point of each step (hangs it at the heartbeat) and, with the
``pause`` action, also freezes A past its lease at each point where it holds one, so that another
worker takes over and A wakes up stale: the lease-takeover exercise at every point. On a PostgreSQL
store, ``--actions terminate`` ends A's database sessions once at each point of each step, including
the store's own ``before_db_commit`` and ``in_db_commit`` in each write transaction of an attempt
(claim, receipt, commit): there a lost connection leaves the transaction rolled back, or committed
without A knowing, and recovery must settle it.

Beyond the first hit of each point, the matrix explores paths (``--hits``, default ``paths``): it
first makes one fault-free run with worker A alone, reads every point A passed, and kills A at each
later hit that ends a path no earlier hit took -- the compensation after a declined charge, the
second and third attempts after transient errors (:mod:`killpoint.harness.paths`). ``--hits all``
kills every hit that run reached, ``--hits first`` only the first ones, ``--max-hits N`` bounds the
later hits crashed; the JSON's ``hits`` says how many were reached, explored and left.

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
import dataclasses
import sys
from typing import Any

from killpoint.chaos import generator
from killpoint.chaos.generator import ACTIONS, FORMS
from killpoint.chaos.schedule import Schedule
from killpoint.chaos.points import DB_POINTS
from killpoint.errors import BadInput, shown
from killpoint.harness import inputs
from killpoint.harness.commands.options import (_names, add_common, declared_target, jobs_of, parse_steps,
                                                run_config, target_points, whole, workload_of)
from killpoint.harness.commands.output import finish, progress_for, stream_pages
from killpoint.harness.commands.summary import Summary, until_broken
from killpoint.harness.paths import (discovery, explore_hits, explore_recovery, kills, once_per_worker, points_only,
                                     recovery_probe, stepless_points)
from killpoint.harness.redact import redact
from killpoint.harness.run import Session

HELP = ("run every single-fault schedule (each point x each step, killed or paused past its lease), "
        "or with --depth 2 every ordered pair of crashes, and check every invariant")


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
    p.add_argument("--depth", type=whole("--depth"), choices=(1, 2), default=1,
                   help="1: every single crash (default); 2: every ordered pair of crashes")
    p.add_argument("--forms", default=None,
                   help="with --depth 2 only: workers (A then B), hits (A twice, restarted under its "
                        "own identity), or both (default)")
    p.add_argument("--hits", choices=generator.HIT_MODES, default=None,
                   help="with --depth 1: which hits past the first of each point to kill, after a "
                        "fault-free run with worker A alone shows which it reaches: paths (default: "
                        "each hit that ends a path no earlier one took, as a retry or a "
                        "compensation), all (every hit reached, on every instance) or first (none)")
    p.add_argument("--max-hits", type=whole("--max-hits"), default=None, metavar="N",
                   help="with --depth 1: kill at most N of those later hits (default: no bound); "
                        "the JSON's hits.left says how many were left")
    p.add_argument("--recovery-paths", action="store_true",
                   help="with --depth 1: also run each kill of A again with A alone, restarted under "
                        "its own identity, and kill it a second time at each hit of its recovery that "
                        "ends a path not seen before (several times the runs of the default matrix)")
    p.add_argument("--cross-steps", action="store_true",
                   help="with --depth 2 only: pair faults on different steps too (workers form only)")


def _users_own(target: Any) -> bool:
    """A target the user declared (``pkg.module:function``), whose declaration the user can change:
    not the reference, a mutant, or one of killpoint's library and server targets."""
    from killpoint.harness import libs
    from killpoint.harness.targets import SERVER_TARGETS

    if not isinstance(target, str) or target == "reference" or target.startswith("mutant:"):
        return False
    return not libs.is_library_target(target) and target.partition(":")[0] not in SERVER_TARGETS


def _say_missing_windows(target: str, declared: Any) -> None:
    """A warning when the matrix cannot pause where the target's workers hold a lease, or cannot
    bring a paused worker back in the takeover window: its declaration does not say where."""
    import warnings

    from killpoint.errors import KillpointWarning

    how = "name them in its declaration: @killpoint.target(..., lease_points=(...), claim_point=...)"
    if not declared.lease_points:
        warnings.warn(f"--actions pause: {target} declares no point where a worker holds a lease, so no "
                      f"pause is scheduled; {how}", KillpointWarning, stacklevel=1)
    elif declared.claim_point is None:
        warnings.warn(f"--actions pause: {target} declares no point a worker reaches once it has taken a lease, "
                      f"so no pause comes back in the takeover window (only after the new holder moved "
                      f"the step on); {how}", KillpointWarning, stacklevel=1)


def _hits_mode(args: argparse.Namespace) -> str:
    """Which hits past the first the matrix explores (``--hits``), its options checked together
    with ``--depth``, ``--forms`` and ``--cross-steps``."""
    if args.depth != 2:  # they shape pairs of crashes: at depth 1 they were dropped without a word
        if args.forms is not None:
            raise BadInput(f"--forms {shown(args.forms)}: forms are pairs of crashes, which only "
                           f"--depth 2 runs; add --depth 2, or leave --forms out")
        if args.cross_steps:
            raise BadInput("--cross-steps: pairs of crashes on different steps are run only with "
                           "--depth 2; add --depth 2, or leave --cross-steps out")
    elif args.hits is not None or args.max_hits is not None or args.recovery_paths:
        option = "--hits" if args.hits is not None else "--max-hits" if args.max_hits is not None \
            else "--recovery-paths"
        raise BadInput(f"{option}: later hits are explored "
                       f"by the single-fault matrix; leave it out with --depth 2, whose pairs put "
                       f"their second crash on the hit after the first")
    if args.max_hits is not None and args.max_hits < 0:
        raise BadInput(f"--max-hits {args.max_hits}: give a whole number of at least 0")
    hits_mode = "first" if args.depth != 1 else (args.hits or "paths")
    if args.recovery_paths and hits_mode == "first":
        raise BadInput("--recovery-paths --hits first: recovery paths are found by the fault-free "
                       "run that --hits first leaves out; use --hits paths or all")
    return hits_mode


def _single_fault_plans(args: argparse.Namespace, steps: tuple[str, ...],
                        points: tuple[str, ...]) -> tuple[tuple[str, ...], list[Any]]:
    """``--depth 1``: the actions asked for (``--actions``, checked) and a plan for each point of
    each step and each action."""
    actions = _names(args.actions, "--actions", "kill,pause")
    wrong = inputs.unknown_actions(actions, ACTIONS)
    if wrong:
        raise BadInput(f"--actions: {wrong}")
    if "terminate" in actions and not str(args.store).startswith(("postgresql://", "postgres://")):
        raise BadInput(f"--actions terminate: ending a worker's database sessions needs a "
                       f"postgresql:// store, not --store {shown(redact(args.store))}")
    if "terminate" in actions and declared_target(args).owns_state:
        raise BadInput(f"--actions terminate: {args.target} keeps its state in a store of its own, "
                       f"and terminate ends the sessions of killpoint's store, which its workers do "
                       f"not write through; use kill or pause")
    # Unless --points narrows it, terminate also runs inside the PostgreSQL store's COMMIT: at
    # the target's points (the ones it declares, and only those) and the store's own.
    terminate_points = points if args.points is not None else points + DB_POINTS
    declared = declared_target(args)
    if "pause" in actions and _users_own(args.target):
        _say_missing_windows(args.target, declared)
    plans = generator.matrix(steps, points, depth=1, actions=actions, terminate_points=terminate_points,
                             order=tuple(declared.points), lease=declared.lease_points,
                             claim=declared.claim_point)
    if not plans:
        raise BadInput(f"--points {shown(','.join(points))} --actions {shown(','.join(actions))}: no run "
                       f"to make: a pause is scheduled only where a lease is held "
                       f"({', '.join(declared.lease_points) or 'this target declares no such point'})")
    return actions, plans


def _pair_plans(args: argparse.Namespace, steps: tuple[str, ...],
                points: tuple[str, ...]) -> tuple[tuple[str, ...], list[Any]]:
    """``--depth 2``: the forms asked for (``--forms``, checked) and a plan for each ordered pair."""
    text = ",".join(FORMS) if args.forms is None else args.forms
    forms = _names(text, "--forms", "both")
    bad = [f for f in forms if f not in FORMS]
    if bad:
        raise BadInput(f"--forms: unknown form {', '.join(map(shown, bad)) or shown(text)}; "
                       f"use workers, hits or both")
    plans = generator.matrix(steps, points, depth=2, forms=forms, cross_steps=args.cross_steps,
                             order=declared_target(args).points)
    return forms, plans


def _later_hits(args: argparse.Namespace, session: Session, summary: Summary, progress: Any,
                configs: list[Any], steps: tuple[str, ...], points: tuple[str, ...],
                hits_mode: str) -> list[Any]:
    """The fault-free run with A alone, whose hits tell which later ones to crash, and (with
    ``--recovery-paths``) each kill again with A alone; returns ``configs`` with the later hits'
    runs added, and keeps what it found in ``summary``."""
    # Judged as every run is, and shown among the results when it is not valid: a worker that
    # fails with no fault at all fails here, and that is never hidden.
    probe = discovery(run_config(args, Schedule()))
    progress.step("finding the hits a fault-free run reaches (worker A alone)")
    found = session.run(probe)
    exploration = dataclasses.replace(explore_hits(found, steps, points, hits_mode, args.max_hits),
                                      discovery=found.verdict.valid)
    if found.valid is not True:
        summary.add(found, keep_events=False)
        progress.step("no faults, worker A alone", found)
    if found.infrastructure is not None:  # every run after it would meet the same failure
        summary.planned = len(summary.results) + len(configs)
        return []
    if args.depth == 1:
        # A point A passed only outside any step is crashed once, not once per step
        configs = once_per_worker(configs, stepless_points(found, points))
    if args.recovery_paths:
        # Each kill again, A alone and restarted as itself: what its recovery passes.
        killed = kills([c.schedule for c in configs] + list(exploration.schedules))
        probes = [recovery_probe(run_config(args, s)) for s in killed]
        progress.display.total = progress.display.done + len(configs) + len(exploration.plans) + len(probes)
        seen = []
        for result in until_broken(session.run_many(probes, jobs=jobs_of(args))):
            seen.append(points_only(result))  # all explore_recovery reads of it
            summary.add(result, keep_events=False)
            progress.step(f"{result.config.schedule} (A alone, restarted as itself)", result)
            if result.infrastructure is not None:
                summary.planned = len(summary.results) + len(probes) - len(seen) + len(configs)
                return []
        exploration = explore_recovery(exploration, seen, steps, points, args.max_hits)
        del seen
    configs += [run_config(args, p.schedule, **p.overrides()) for p in exploration.plans]
    summary.exploration = exploration
    summary.planned = len(summary.results) + len(configs)
    progress.display.total = progress.display.done + len(configs)
    return configs


def run(args: argparse.Namespace) -> int:
    hits_mode = _hits_mode(args)
    points = target_points(args, args.points)
    actions: tuple[str, ...] = ()
    workload = workload_of(args)
    steps = parse_steps(args.steps, workload.step_names, workload.name)
    if args.steps is None and args.depth == 2:
        steps = generator.repeated_steps(workload)
    if args.depth == 1:
        actions, plans = _single_fault_plans(args, steps, points)
    else:
        forms, plans = _pair_plans(args, steps, points)
    configs = [run_config(args, p.schedule, **p.overrides()) for p in plans]
    if args.depth == 2 and not args.json:
        print(f"killpoint matrix --depth 2: {len(configs)} runs (steps {', '.join(steps)} x "
              f"{len(points)} x {len(points)} points"
              f"{' x ' + str(len(steps)) + ' steps' if args.cross_steps else ''}, forms "
              f"{', '.join(forms)}); choose with --steps, --points or --forms", file=sys.stderr)
    summary = args._summary = Summary(planned=len(configs))  # what _broken prints, if it comes to that
    explore = hits_mode != "first" and "kill" in actions
    if hits_mode != "first" and not explore and (args.hits or args.max_hits is not None or args.recovery_paths):
        raise BadInput(f"--actions {shown(','.join(actions))}: later hits are explored with kills; add "
                       f"kill to --actions, or leave --hits, --max-hits and --recovery-paths out")
    title = f"killpoint matrix{' --depth 2' if args.depth == 2 else ''}"
    progress = progress_for(args, len(configs), title)
    # Each run's page written as the run ends (or held until some run fails, --report on-failure):
    # the summary keeps no run's events for the reports.
    stream_pages(args, summary, title, many=explore or len(configs) > 1)
    with Session(real_time=args.real_time) as session:
        if explore:
            configs = _later_hits(args, session, summary, progress, configs, steps, points, hits_mode)
        if configs:
            progress.step(str(configs[0].schedule))  # at once: the first result may take a while
        for i, result in enumerate(until_broken(session.run_many(configs, jobs=jobs_of(args)))):
            summary.add(result, keep_events=False)
            progress.step(str(result.config.schedule), result)
            if i + 1 < len(configs):
                progress.step(str(configs[i + 1].schedule))
    progress.close()
    return finish(args, summary, title)
