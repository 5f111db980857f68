"""``killpoint replay``: run one schedule again, as a failure printed it, and give its verdict.

Everything a run does flows from its schedule, target, seed, workload, worker count and restart
rule, so the same command gives the same verdict. ``--repeat N`` runs it N times and says whether
all N verdicts agreed: the quickest check that a counterexample is not a matter of timing.
"""

from __future__ import annotations

import argparse
import json
import sys

from killpoint import vocab
from killpoint.harness.colour import Colour
from killpoint.errors import BadInput, shown
from killpoint.harness.commands.options import (add_common, add_same_identity, one_line, run_config, same_identity,
                                                whole)
from killpoint.harness.commands.output import (print_json_hint, print_stats, progress_for, report_hint, say_stopped,
                                               write_reports)
from killpoint.harness.commands.summary import EXIT_UNKNOWN, EXIT_VIOLATED, Summary, replay_command
from killpoint.harness.narrate import clock_legend, story

HELP = "run one schedule again (as printed by matrix, explore or selftest) and give its verdict"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("schedule", help="the schedule, e.g. 'A@charge.after_call:kill' ('' for no faults)")
    add_common(p)
    add_same_identity(p)
    p.add_argument("--repeat", type=whole("--repeat"), default=1, metavar="N",
                   help="run it N times and check that every verdict is the same (default: 1)")
    p.add_argument("--narrate", action="store_true",
                   help="tell the story of the run, as the demo does: who claimed what with which "
                        "fence, what the downstream answered, who was killed or refused")


def parse_schedule(text: str, args: argparse.Namespace | None = None):
    """The schedule, or a one-line :class:`BadInput` that quotes the bad part (with ``args``, the
    target's declared crash points are names too)."""
    from killpoint import chaos
    from killpoint.harness.commands import options

    if args is not None:
        return options.parse_schedule(args, text)
    try:
        return chaos.parse(text, context=False)
    except chaos.InvalidSchedule as exc:
        raise BadInput(f"schedule {shown(text)}: {one_line(str(exc), 600)}") from None


def run(args: argparse.Namespace) -> int:
    from killpoint.harness.mutants import overrides_for
    from killpoint.harness.run import Session

    schedule = parse_schedule(args.schedule, args)
    chance = same_identity(args)
    if args.repeat < 1:
        raise BadInput(f"--repeat {args.repeat}: use a whole number of at least 1")
    config = run_config(args, schedule, same_identity=chance,
                        **overrides_for(args.target))
    summary = Summary()
    title = f"killpoint replay {schedule or 'no faults'}"
    progress = progress_for(args, args.repeat, title)
    with Session() as session:
        for _ in range(args.repeat):
            progress.step(str(schedule))
            summary.results.append(session.run(config))
            progress.step(str(schedule), summary.results[-1])
            if summary.results[-1].infrastructure is not None:  # the repeats after it would meet it too
                summary.planned = args.repeat
                break
    progress.close()
    if summary.not_run:
        say_stopped(len(summary.results), args.repeat, summary.infrastructure or "")
    write_reports(args, summary, title)
    verdicts = [(r.valid, tuple(sorted({v.invariant for v in r.verdict.violations})))
                for r in summary.results]
    agree = len(set(verdicts)) == 1
    reproduce = replay_command(summary.results[0])
    broken = any(reason.startswith("infrastructure failure") for r in summary.results
                 for reason in r.verdict.unknown_reasons)
    # Verdicts that differ say the outcome depends on timing -- unless the infrastructure broke
    # under one of the runs: that says nothing about the schedule (exit 3, the cause printed).
    code = summary.exit_code() if agree else EXIT_UNKNOWN if broken else EXIT_VIOLATED
    if args.json:
        out = summary.to_json()
        for v in out["violations"]:
            v["reproduce"] = reproduce
        out["reproduce"] = reproduce
        out["agree"] = agree
        out["verdicts"] = [{"valid": v, "violated": list(names)} for v, names in verdicts]
        print(json.dumps(out, indent=2))
        print_json_hint(args, summary)
        return code
    word = vocab.VERDICT_WORDS
    paint = Colour.for_stream(sys.stdout)
    first = summary.results[0]
    print(f"replay of {schedule or 'no faults'} on {first.config.target_name}, seed {first.config.seed}")
    if args.narrate:
        print(clock_legend(first.config.virtual_time))
        for n, result in enumerate(summary.results, start=1):
            print(f"\nrun {n} of {len(summary.results)}:" if len(summary.results) > 1 else "")
            for text in story(result):
                print(f"  {text}")
    for v in first.verdict.violations:
        print(f"\n{paint.verdict('VIOLATED')} {v.invariant} at {v.instance}:{v.step}")
        print(f"  {v.detail}")
    for reason in first.verdict.unknown_reasons:
        print(f"\n{paint.verdict('UNKNOWN')}: {reason}")
    if first.valid is False:  # its unknown reasons are not printed: what the target's hooks did wrong is
        for error in first.target_errors:
            print(f"\n{paint.verdict('TARGET ERROR')}: {error}")
    for reason in summary.reasons():
        if reason not in first.verdict.unknown_reasons:
            print(f"\n{paint.verdict('UNKNOWN')}: {reason}")
    if args.repeat > 1:
        print()
        for n, (valid, names) in enumerate(verdicts, start=1):
            print(f"{n:>3}. {word[valid]}{': ' + ', '.join(names) if names else ''}")
        print("every verdict the same" if agree else
              "VERDICTS DIFFER: the outcome of this schedule depends on timing")
    if args.stats:
        print_stats(summary)
    hint = report_hint(args, summary)
    if hint:
        print(f"\n{hint}")
    brief = summary.exercise().brief()
    print(f"\nverdict: {paint.verdict(word[summary.valid])} ({len(summary.results)} run(s)"
          + (f"; {brief}" if brief else "")
          + (f"; report: {summary.report}" if summary.report else "") + ")")
    print(f"reproduce: {reproduce}")
    return code
