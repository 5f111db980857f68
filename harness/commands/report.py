"""``killpoint report``: run one schedule and always write its HTML report.

The quickest way from a schedule (printed by a red CI run, or written by hand) to a page that
explains it: the verdict, each violation with the events that prove it, the swimlane timeline,
the event table and the downstream ledger.
"""

from __future__ import annotations

import argparse
import os

from killpoint.errors import BadInput, shown
from killpoint.harness.commands.options import add_common, add_same_identity, one_line, run_config, same_identity
from killpoint.harness.commands.output import finish, progress_for
from killpoint.harness.commands.summary import Summary

HELP = "run one schedule and write its HTML report (verdict, violations, timeline, ledger)"
DEFAULT_DIR = "killpoint-report"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p, report=False)
    add_same_identity(p)  # a depth-2 or exploration counterexample's reproduce line carries it
    p.add_argument("--schedule", required=True,
                   help="the schedule to run, e.g. 'A@charge.after_call:kill' ('' for no faults)")
    # This command exists to write a report: --report always and on-failure are accepted for
    # symmetry (it is written whatever the verdict), never is refused. A destination of its own,
    # so that a project's [tool.killpoint] report = "never", meant for the other commands, does
    # not stop this one.
    p.add_argument("--report", dest="report_flag", choices=("always", "on-failure", "never"), default=None,
                   help="accepted for symmetry: the report is always written (never is refused)")
    p.set_defaults(report_dir=DEFAULT_DIR, report="always")


def run(args: argparse.Namespace) -> int:
    from killpoint import chaos
    from killpoint.harness.run import Session
    from killpoint.reports import page_names

    from killpoint.harness.commands.options import declared_target
    from killpoint.chaos.points import DB_POINTS

    if args.report_flag == "never":  # before: the report was written all the same
        raise BadInput("--report 'never': the report command runs a schedule to write its report; "
                       "use killpoint replay to run it without one")
    try:  # the target's declared points are names too (A@before_ack:kill)
        schedule = chaos.parse(args.schedule, points=frozenset(declared_target(args).points) | frozenset(DB_POINTS),
                               context=False)
    except chaos.InvalidSchedule as exc:
        raise BadInput(f"--schedule {shown(args.schedule)}: {one_line(str(exc), 600)}") from None
    if os.path.exists(args.report_dir) and not os.path.isdir(args.report_dir):
        raise BadInput(f"--report-dir {shown(args.report_dir)} is a file: name a directory to write into")
    config = run_config(args, schedule, same_identity=same_identity(args))
    args.report = "always"
    summary = Summary()
    title = f"killpoint report {schedule or 'no faults'}"
    progress = progress_for(args, 1, title)
    with Session() as session:
        progress.step(str(schedule))
        summary.results.append(session.run(config))
        progress.step(str(schedule), summary.results[-1])
    progress.close()
    run_page = os.path.join(args.report_dir, page_names([summary.results[0].run_id])[0])
    return finish(args, summary, title, [f"run report: {run_page}"])
