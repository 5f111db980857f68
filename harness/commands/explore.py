"""``killpoint explore``: search schedules with Hypothesis, far beyond the single-crash matrix.

The search itself is :func:`killpoint.harness.explore.explore`; this command reads its options,
prints what it returns and writes its reports.

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

``--jobs N`` runs the schedules Hypothesis will draw next, and the replays that confirm a
counterexample, N side by side (:mod:`killpoint.harness.lookahead`); shrinking goes one run at a
time. The same seed gives the same counterexample with any N.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from killpoint.errors import BadInput
from killpoint.harness.commands.options import add_common, jobs_of, run_config, target_points, whole
from killpoint.harness.commands.output import print_json_hint, progress_for, report_hint, write_html, write_junit
from killpoint.harness.commands.summary import EXIT_UNKNOWN, EXIT_VALID, EXIT_VIOLATED, Summary
from killpoint.harness.examples_db import DEFAULT_DATABASE, parse_database
from killpoint.harness.explore import Exploration

HELP = ("search schedules with Hypothesis (several faults per run); shrink a failure to a minimal "
        "schedule and print how to replay it")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--budget", type=whole("--budget"), default=100, metavar="N",
                   help="schedules to try before giving up (default: 100); shrinking a "
                        "counterexample takes extra runs")
    p.add_argument("--max-faults", type=whole("--max-faults"), default=3, metavar="K",
                   help="at most K faults per schedule (default: 3)")
    p.add_argument("--points", default=None,
                   help="comma-separated crash points (default: all but the PostgreSQL store's "
                        "before_db_commit and in_db_commit)")
    p.add_argument("--steps", default=None, help="comma-separated step names (default: all)")
    p.add_argument("--database", default=DEFAULT_DATABASE, metavar="DB",
                   help=f"where Hypothesis keeps the examples it found, so a failure found once replays "
                        f"first next time, here or on any machine naming the same database: a folder "
                        f"(default: {DEFAULT_DATABASE}; a CI job can upload it as an artifact), a "
                        f"redis://HOST:PORT[/DB][?key_prefix=P] URL shared between machines, or 'none' "
                        f"to keep and write nothing")


def _check_database(where: str) -> None:
    """Refuse, before the search, a ``--database`` Hypothesis could not keep its examples in (a
    file, a folder that cannot be written): it wrote nothing there and said nothing, and the next
    run started from scratch. Made if it is not there, as Hypothesis would make it."""
    import os
    import tempfile

    from killpoint.errors import shown

    if os.path.exists(where) and not os.path.isdir(where):
        raise BadInput(f"--database {shown(where)}: not a folder; name a folder for Hypothesis's examples, "
                       f"or 'none' to keep none")
    try:
        os.makedirs(where, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=where, prefix=".killpoint-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise BadInput(f"--database {shown(where)}: cannot write there ({exc.strerror or exc}); name a "
                       f"folder that can be written, or 'none' to keep no examples") from None


def _steps(args: argparse.Namespace) -> tuple[str, ...]:
    from killpoint.harness.commands.options import parse_steps, workload_of

    workload = workload_of(args)
    return parse_steps(args.steps, workload.step_names, workload.name)


def run(args: argparse.Namespace) -> int:
    from killpoint.harness.explore import explore
    from killpoint.harness.mutants import overrides_for

    if args.budget < 1:
        raise BadInput(f"--budget {args.budget}: use a whole number of at least 1")
    if args.max_faults < 1:
        raise BadInput(f"--max-faults {args.max_faults}: use a whole number of at least 1")
    database = parse_database(args.database)  # a bad value is exit 2 before any run
    if database.kind == "folder":
        _check_database(database.location)
    points = target_points(args, args.points)
    steps = _steps(args)
    base = run_config(args, None, **overrides_for(args.target))  # validates target, store, workers
    progress = progress_for(args, None, f"killpoint explore {args.target}")  # shrinking goes past the budget
    found = explore(base, steps=steps, points=points, budget=args.budget, seed=args.seed,
                    max_faults=args.max_faults,
                    database=database,
                    on_run=progress.step, jobs=jobs_of(args))
    progress.close()
    return _report(args, found)


def _report(args: argparse.Namespace, search: Exploration) -> int:
    minimal = search.minimal
    elapsed = search.duration_s
    if minimal is not None:
        code = EXIT_VIOLATED
    elif search.unknown or search.reasons:
        code = EXIT_UNKNOWN
    else:
        code = EXIT_VALID
    found: dict[str, Any] = {}  # the shrunk counterexample; empty when there is none
    # The reports: the counterexample's, and those of runs that could not be judged; JUnit: every run.
    shown = Summary(results=([minimal.result] if minimal is not None else []) + list(search.unknown))
    title = f"killpoint explore {args.target}"
    if shown.results:
        write_html(args, shown, title)
    write_junit(args, Summary(results=list(search.seen)), title)
    if minimal is not None:
        experiment = minimal.experiment
        found = {"schedule": minimal.schedule, "faults": len(experiment.schedule.faults),
                 "same_identity": experiment.same_identity, "violated": list(minimal.violated),
                 "reproduce": minimal.reproduce, "confirmed": minimal.confirmed, "flaky": minimal.flaky,
                 "replays": minimal.replays, "replays_failed": minimal.replays_failed}
    if args.json:
        violations = []
        if minimal is not None:
            violations = [{**v.to_json(), "schedule": found["schedule"], "reproduce": found["reproduce"]}
                          for v in minimal.result.verdict.violations]
        print(json.dumps({
            "valid": search.valid,
            "runs": search.runs, "budget": args.budget, "seed": args.seed, "target": args.target,
            "duration_s": round(elapsed, 1), "violations": violations,
            "invariants": search.invariants, "report": shown.report, "minimal": found or None,
            "counterexamples_seen": search.failures, "unfired_only": search.unfired,
            "not_exercised_only": search.not_exercised,
            "points": search.points.to_json(), "exercise": search.exercise.to_json(),
            "unknown_reasons": list(search.reasons) + list(dict.fromkeys(
                reason for r in search.unknown for reason in r.verdict.unknown_reasons)),
            "unknown": [{"schedule": r.schedule, "reasons": list(r.verdict.unknown_reasons)}
                        for r in search.unknown],
        }, indent=2))
        if shown.results:
            print_json_hint(args, shown)
        return code
    print(f"explore {args.target}: {search.runs} runs in {elapsed:.1f} s (budget {args.budget}, "
          f"seed {args.seed}); {search.valid_runs} valid, {search.unfired} with a drawn fault that never fired, "
          f"{search.not_exercised} whose drawn pause or hang nobody took over (not exercised)")
    if search.exercise.line():
        print(f"exercised: {search.exercise.line()}")
    for r in search.unknown:
        print(f"\nUNKNOWN under {r.schedule}: {'; '.join(r.verdict.unknown_reasons)}")
    for reason in search.reasons:
        print(f"\nUNKNOWN: {reason}")
    if args.stats:
        print(f"\ncrash points over {search.points.runs} run(s), {search.points.total_fired} fired:")
        for line in search.points.lines():
            print(f"  {line}")
    if minimal is None:
        print("\nno violation found" + ("" if not (search.unknown or search.reasons) else
                                         "; some runs could not be judged" if search.unknown else
                                         "; the search did not exercise what it had to"))
        _where_report(args, shown)
        return code
    experiment, result = minimal.experiment, minimal.result
    restart = ("" if experiment.same_identity == 0.5 else
               f" (killed workers restart under {'their own' if experiment.same_identity else 'a fresh'} identity)")
    if minimal.confirmed:
        print(f"\ncounterexample found ({search.failures} failing run(s) in all), shrunk and confirmed: "
              f"{found['faults']} fault(s), failed {minimal.replays_failed}/{minimal.replays} replays: "
              f"{experiment.schedule or 'no fault at all (the worker fails without one)'}{restart}")
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
