"""``killpoint explore``: search schedules with Hypothesis, far beyond the single-crash matrix.

Each example is a schedule of one to a few faults (kills anywhere, including inside the call,
pauses past the lease, hangs, short sleeps), plus the rule for restarting killed workers (under a
fresh identity, or under their own). A run whose verdict is invalid is a counterexample; Hypothesis
shrinks it, and the smallest counterexamples are then *confirmed* (:mod:`killpoint.harness.confirm`):
replayed five times, shrunk further one fault at a time, and only a schedule that failed every
replay is printed as the counterexample, with how many replays failed and the one-line ``killpoint
replay`` command that reproduces it. Stalls are drawn relative to the run's lease TTL and stuck
bound, below and well past them.

Every draw flows from ``--seed``. Hypothesis keeps what it found under ``.killpoint/hypothesis`` in
the working directory (laid out as pytest's ``.hypothesis/``, examples under ``examples/``), so
running the same command again starts from the last counterexample.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from killpoint.harness.commands.common import (EXIT_UNKNOWN, EXIT_VALID, EXIT_VIOLATED, BadInput, Summary,
                                               add_common, parse_points, progress_for, replay_command,
                                               report_hint, run_config, target_points, write_html,
                                               write_junit)
from killpoint.harness.history import History
from killpoint.harness.stats import PointStats

HELP = ("search schedules with Hypothesis (several faults per run); shrink a failure to a minimal "
        "schedule and print how to replay it")
DEFAULT_DATABASE = os.path.join(".killpoint", "hypothesis")
# Restart rules a run can draw, simplest first: the default mix, always the same identity, never.
SAME_IDENTITY = (0.5, 1.0, 0.0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--budget", type=int, default=100, metavar="N",
                   help="schedules to try before giving up (default: 100); shrinking a "
                        "counterexample takes extra runs")
    p.add_argument("--max-faults", type=int, default=3, metavar="K",
                   help="at most K faults per schedule (default: 3)")
    p.add_argument("--points", default=None,
                   help="comma-separated crash points (default: all but the PostgreSQL store's "
                        "before_db_commit and in_db_commit)")
    p.add_argument("--steps", default=None, help="comma-separated step names (default: all)")
    p.add_argument("--database", default=DEFAULT_DATABASE, metavar="DIR",
                   help=f"Hypothesis's folder for this search: examples and caches (default: "
                        f"{DEFAULT_DATABASE}; 'none' to keep no examples)")


@dataclass(frozen=True)
class Experiment:
    """One example: a schedule and the chance that a killed worker keeps its identity."""

    schedule: Any  # chaos.Schedule
    same_identity: float = 0.5


@dataclass
class Search:
    """What a search saw: run counts, unjudgeable runs, counterexamples in the order found."""

    runs: int = 0
    valid: int = 0
    unfired: int = 0  # runs unknown only because a drawn fault never fired
    unknown: list[Any] = field(default_factory=list)  # RunResults unknown for another reason
    failures: int = 0  # counterexamples seen, shrinking included
    last: tuple[Experiment, Any] | None = None  # Hypothesis's final one: the shrunk counterexample
    smallest: tuple[Experiment, Any] | None = None  # the fallback when the last did not reproduce
    invariants: dict[str, dict[str, int]] = field(default_factory=dict)
    seen: list[Any] = field(default_factory=list)  # every run, without its history (for JUnit)
    points: PointStats = field(default_factory=PointStats)  # crash points reached and fired, all runs
    failing: list[Experiment] = field(default_factory=list)  # every counterexample, in order

    def failed(self, experiment: Experiment, result: Any) -> None:
        self.failures += 1
        self.failing.append(experiment)
        self.last = (experiment, result)
        if self.smallest is None or _size(experiment) < _size(self.smallest[0]):
            self.smallest = self.last

    def record(self, result: Any) -> None:
        self.runs += 1
        self.seen.append(dataclasses.replace(result, history=History(())))
        self.points = self.points + PointStats.of(result.history)
        for res in result.verdict.results:
            counts = self.invariants.setdefault(res.invariant, {"checked": 0, "violated": 0})
            counts["checked"] += res.checked
            counts["violated"] += res.valid is False
        if result.valid is True:
            self.valid += 1
        elif result.valid is None:
            if all("never fired" in reason for reason in result.verdict.unknown_reasons):
                self.unfired += 1
            else:
                self.unknown.append(result)


def _size(experiment: Experiment) -> tuple[int, int]:
    return len(experiment.schedule.faults), len(str(experiment.schedule))


class _Found(Exception):
    """Raised inside the Hypothesis test to mark a counterexample (Hypothesis then shrinks it)."""


def _steps(args: argparse.Namespace) -> tuple[str, ...]:
    from killpoint.harness.commands.common import parse_steps, workload_of

    return parse_steps(args.steps, workload_of(args).step_names)


def database_key(args: argparse.Namespace, steps: tuple[str, ...], points: tuple[str, ...]) -> bytes:
    """Examples are kept per search space: the same target, workload and shape of schedule."""
    from killpoint.harness.commands.common import workload_name

    text = json.dumps([args.target, workload_name(args), args.workers, args.max_faults, list(steps),
                       list(points)])
    return hashlib.sha256(text.encode()).digest()


def run(args: argparse.Namespace) -> int:
    from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
    from hypothesis import strategies as st
    from hypothesis.database import DirectoryBasedExampleDatabase
    from hypothesis.errors import Flaky

    from killpoint.chaos.strategies import schedules, stall_durations
    from killpoint.harness.mutants import overrides_for
    from killpoint.harness.run import Session

    if args.budget < 1:
        raise BadInput(f"--budget {args.budget}: use a whole number of at least 1")
    if args.max_faults < 1:
        raise BadInput(f"--max-faults {args.max_faults}: use a whole number of at least 1")
    points = target_points(args, args.points)
    steps = _steps(args)
    base = run_config(args, None, **overrides_for(args.target))  # validates target, store, workers
    workers = [chr(ord("A") + i) for i in range(args.workers)]
    stalls = stall_durations(base.timing.lease_ttl_ms, base.timing.stuck_bound_ms)
    experiments = st.builds(Experiment, schedules(workers, steps, points=points,
                                                  max_faults=args.max_faults, stalls_ms=stalls),
                            st.sampled_from(SAME_IDENTITY))
    home = DEFAULT_DATABASE if args.database == "none" else args.database
    database = None if args.database == "none" else \
        DirectoryBasedExampleDatabase(os.path.join(home, "examples"))
    search = Search()
    progress = progress_for(args, None, f"killpoint explore {args.target}")  # shrinking goes past the budget
    started = time.monotonic()

    with Session() as session:
        def trial(experiment: Experiment) -> None:
            config = dataclasses.replace(base, schedule=experiment.schedule,
                                         same_identity=experiment.same_identity)
            progress.step(str(experiment.schedule))
            result = session.run(config)
            search.record(result)
            progress.step(str(experiment.schedule), result)
            if result.valid is False:
                search.failed(experiment, result)
                raise _Found

        test = settings(database=database, max_examples=args.budget, deadline=None,
                        suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
                        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
                        report_multiple_bugs=False, derandomize=False, print_blob=False)(
            seed(args.seed)(given(experiments)(trial)))
        test._hypothesis_internal_database_key = database_key(args, steps, points)  # type: ignore[attr-defined]
        flaky = False
        with _hypothesis_home(home):
            try:
                test()
            except _Found:
                pass
            except Flaky:
                flaky = True  # the shrunk example did not fail again: confirmation decides
        confirmed, tried = _confirm(session, base, search)
    progress.close()
    elapsed = time.monotonic() - started

    minimal = search.smallest if flaky else search.last
    if confirmed is not None:
        minimal = (Experiment(confirmed.config.schedule, confirmed.config.same_identity), confirmed.result)
    return _report(args, search, minimal, confirmed, tried, elapsed)


CANDIDATES = 4  # the smallest distinct counterexamples a search hands to confirmation


def _confirm(session: Any, base: Any, search: Search) -> tuple[Any, list[Any]]:
    """Replay the smallest counterexamples seen (see :mod:`killpoint.harness.confirm`)."""
    from killpoint.harness.confirm import confirm

    if not search.failing:
        return None, []
    distinct = {(str(e.schedule), e.same_identity): e for e in search.failing}
    smallest = sorted(distinct.values(), key=_size)[:CANDIDATES]
    configs = [dataclasses.replace(base, schedule=e.schedule, same_identity=e.same_identity)
               for e in smallest]
    return confirm(session.run, configs)


@contextlib.contextmanager
def _hypothesis_home(path: str) -> Iterator[None]:
    """Point Hypothesis's own files (its caches) at ``path`` for the search, not ``./.hypothesis``.

    The setting is process-wide, so the previous one comes back afterwards (a test suite that
    calls ``explore`` keeps its own Hypothesis folder).
    """
    from hypothesis import configuration

    previous = configuration.storage_directory(intent_to_write=False).home_directory
    configuration.set_hypothesis_home_dir(path)
    try:
        yield
    finally:
        configuration.set_hypothesis_home_dir(previous)


def _report(args: argparse.Namespace, search: Search, minimal: tuple[Experiment, Any] | None,
            confirmed: Any, tried: list[Any], elapsed: float) -> int:
    if minimal is not None:
        code = EXIT_VIOLATED
    elif search.unknown:
        code = EXIT_UNKNOWN
    else:
        code = EXIT_VALID
    found = None
    # The reports: the counterexample's, and those of runs that could not be judged; JUnit: every run.
    shown = Summary(results=([minimal[1]] if minimal is not None else []) + list(search.unknown))
    title = f"killpoint explore {args.target}"
    if shown.results:
        write_html(args, shown, title)
    write_junit(args, Summary(results=list(search.seen)), title)
    if minimal is not None:
        experiment, result = minimal
        best_try = max(tried, key=lambda t: t.failed / t.replays, default=None)
        found = {"schedule": str(experiment.schedule), "faults": len(experiment.schedule.faults),
                 "same_identity": experiment.same_identity,
                 "violated": list(dict.fromkeys(v.invariant for v in result.verdict.violations)),
                 "reproduce": replay_command(result), "confirmed": confirmed is not None,
                 "flaky": confirmed is None,
                 "replays": confirmed.replays if confirmed else (best_try.replays if best_try else 0),
                 "replays_failed": confirmed.failed if confirmed else (best_try.failed if best_try else 0)}
    if args.json:
        violations = []
        if minimal is not None:
            violations = [{**v.to_json(), "schedule": found["schedule"], "reproduce": found["reproduce"]}
                          for v in minimal[1].verdict.violations]
        print(json.dumps({
            "valid": False if minimal else (None if search.unknown else True),
            "runs": search.runs, "budget": args.budget, "seed": args.seed, "target": args.target,
            "duration_s": round(elapsed, 1), "violations": violations,
            "invariants": search.invariants, "report": shown.report, "minimal": found,
            "counterexamples_seen": search.failures, "unfired_only": search.unfired,
            "points": search.points.to_json(),
            "unknown": [{"schedule": r.schedule, "reasons": list(r.verdict.unknown_reasons)}
                        for r in search.unknown],
        }, indent=2))
        return code
    print(f"explore {args.target}: {search.runs} runs in {elapsed:.1f} s (budget {args.budget}, "
          f"seed {args.seed}); {search.valid} valid, {search.unfired} with a drawn fault that never fired")
    for r in search.unknown:
        print(f"\nUNKNOWN under {r.schedule}: {'; '.join(r.verdict.unknown_reasons)}")
    if args.stats:
        print(f"\ncrash points over {search.points.runs} run(s), {search.points.total_fired} fired:")
        for line in search.points.lines():
            print(f"  {line}")
    if minimal is None:
        print("\nno violation found" + ("" if not search.unknown else "; some runs could not be judged"))
        _where_report(args, shown)
        return code
    experiment, result = minimal
    restart = ("" if experiment.same_identity == 0.5 else
               f" (killed workers restart under {'their own' if experiment.same_identity else 'a fresh'} identity)")
    if confirmed is not None:
        print(f"\ncounterexample found ({search.failures} failing run(s) in all), shrunk and confirmed: "
              f"{found['faults']} fault(s), failed {confirmed.failed}/{confirmed.replays} replays: "
              f"{experiment.schedule}{restart}")
    else:
        print(f"\nviolation found ({search.failures} failing run(s) in all), but no schedule failed "
              f"every one of its replays (the best failed {found['replays_failed']}/{found['replays']}): "
              f"its outcome depends on timing; the smallest failing run: {experiment.schedule}{restart}")
    for v in result.verdict.violations:
        print(f"\nVIOLATED {v.invariant} at {v.instance}:{v.step}")
        print(f"  {v.detail}")
    print(f"\nreproduce: {found['reproduce']}")
    _where_report(args, shown)
    return code


def _where_report(args: argparse.Namespace, shown: Summary) -> None:
    hint = report_hint(args, shown)
    if shown.report:
        print(f"report: {shown.report}")
    elif hint and shown.results:
        print(hint)
