"""``killpoint scenario NAME``: run one named crash story and check what it must show.

A scenario passes when every run's verdict is valid and every fact of its story held (a story
that did not happen proves nothing). Exit 0 when both hold, 1 when an invariant was violated or a
fact did not hold (naming them), 2 for a name that is not a scenario (listing the valid ones), 3
when nothing was violated but a verdict is unknown. ``--repeat N`` runs it N times and fails when
the verdicts differ: the quickest proof that a story does not depend on timing.
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import TYPE_CHECKING, Any

from killpoint import vocab
from killpoint.errors import BadInput
from killpoint.harness.commands.options import add_output, add_real_time, add_seed, validate_store, whole
from killpoint.harness.commands.output import print_judgement, print_stats, write_reports
from killpoint.harness.commands.summary import EXIT_UNKNOWN, EXIT_VALID, EXIT_VIOLATED, Summary
from killpoint.harness.redact import redact

if TYPE_CHECKING:
    from killpoint.scenarios import Scenario
    from killpoint.scenarios._story import Story

HELP = ("run a named crash story (the lease-takeover exercise and others), narrate it and check "
        "the facts it must show; --list names them")
WORD = vocab.VERDICT_WORDS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="the scenario to run (see --list)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--target", default="reference",
                   help="reference, mutant:NAME or pkg.module:function (default: reference)")
    p.add_argument("--store", default="sqlite", help="sqlite (default) or a postgresql:// URL")
    add_seed(p)
    p.add_argument("--repeat", type=whole("--repeat"), default=1, metavar="N",
                   help="run it N times and check that every verdict is the same (default: 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_real_time(p, "turn the run clock off: real waits and short timings (see matrix --help)")
    p.add_argument("--report-dir", default=None, help="where to write HTML reports")
    p.add_argument("--report", choices=("always", "on-failure", "never"), default="on-failure",
                   help="when to write HTML reports (default: on-failure)")
    add_output(p)


def reproduce(args: argparse.Namespace) -> str:
    """The one line that runs this scenario again, the store password redacted."""
    parts = ["killpoint", "scenario", args.name]
    if args.target != "reference":
        parts += ["--target", args.target]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    if args.store != "sqlite":
        parts += ["--store", redact(args.store)]
    return " ".join(shlex.quote(p) for p in parts)


def _list(args: argparse.Namespace) -> int:
    from killpoint.scenarios import SCENARIOS

    if args.json:
        print(json.dumps([{"name": s.name, "summary": s.summary, "mutant": s.mutant,
                           "caught_by": s.caught_by} for s in SCENARIOS.values()], indent=2))
        return EXIT_VALID
    width = max(len(n) for n in SCENARIOS)
    for s in SCENARIOS.values():
        print(f"{s.name:<{width}}  {s.summary}")
        broken = (f"mutant:{s.mutant} breaks its rule; {s.caught_by} must catch it" if s.mutant
                  else "no mutant in the zoo breaks its rule yet; its checks catch a worker that does")
        print(f"{'':<{width}}  {broken}")
    print(f"\n{len(SCENARIOS)} scenarios; run one with `killpoint scenario NAME`.")
    return EXIT_VALID


def _scenario(args: argparse.Namespace) -> Scenario:
    from killpoint.harness.targets import InvalidTarget, resolve
    from killpoint.scenarios import UnknownScenario, get

    if not args.name:
        raise BadInput("name a scenario, or use --list to see them")
    try:
        scenario = get(args.name)
    except UnknownScenario as exc:
        raise BadInput(str(exc)) from None
    try:
        resolve(args.target)
    except InvalidTarget as exc:
        raise BadInput(str(exc)) from None
    if args.repeat < 1:
        raise BadInput(f"--repeat {args.repeat}: use a whole number of at least 1")
    validate_store(args.store)
    return scenario


def _verdict(stories: list[Story]) -> tuple[bool | None, bool]:
    """The combined verdict (false > unknown > true) and whether all repeats agreed."""
    from killpoint.harness.checkers.base import rank

    outcomes = [(s.verdict, tuple(sorted({v.invariant for r in s.results for v in r.verdict.violations})),
                 tuple(c.expected for c in s.checks if not c.held)) for s in stories]
    return rank(o[0] for o in outcomes), len(set(outcomes)) == 1


def run(args: argparse.Namespace) -> int:
    if args.list:
        return _list(args)
    scenario = _scenario(args)
    from killpoint.harness.run import Session

    stories: list[Story] = []
    with Session(real_time=args.real_time) as session:
        for _ in range(args.repeat):
            stories.append(scenario.run(session, target=args.target, seed=args.seed, store=args.store))
    summary = Summary([r for s in stories for r in s.results])
    write_reports(args, summary, f"killpoint scenario {scenario.name}")
    valid, agree = _verdict(stories)
    code = (EXIT_VIOLATED if valid is False or not agree else EXIT_UNKNOWN if valid is None
            else EXIT_VALID)
    if args.json:
        print(json.dumps(_json(args, scenario, stories, summary, valid, agree), indent=2))
    else:
        _text(args, scenario, stories, summary, valid, agree)
    return code


def _json(args: argparse.Namespace, scenario: Scenario, stories: list[Story], summary: Summary,
          valid: bool | None, agree: bool) -> dict[str, Any]:
    line = reproduce(args)
    out = summary.to_json()
    for v in out["violations"]:
        v["reproduce"] = line  # a scenario's runs carry hooks a bare schedule cannot replay
    first = stories[0]
    out.update({"valid": valid, "scenario": scenario.name, "summary": scenario.summary,
                "target": getattr(args, "target", "reference"),  # what ran; "mutant": what the story catches
                "mutant": scenario.mutant, "caught_by": scenario.caught_by, "story_held": first.held,
                "checks": [c.to_json() for c in first.checks], "reproduce": line})
    if len(stories) > 1:
        out["agree"] = agree
        out["verdicts"] = [{"valid": s.verdict, "failed_checks": [c.expected for c in s.checks if not c.held]}
                           for s in stories]
    return out


def _text(args: argparse.Namespace, scenario: Scenario, stories: list[Story], summary: Summary,
          valid: bool | None, agree: bool) -> None:
    first = stories[0]
    print(f"killpoint scenario {scenario.name}: {scenario.summary}")
    print()
    print(scenario.story)
    for line in first.lines:
        print(line)
    print()
    several = len(first.results) > 1
    print("What the story must show:")
    for c in first.checks:
        mark = "ok  " if c.held else "MISSING"
        where = f"[run {c.run}] " if several and c.run else ""
        print(f"  {mark} {where}{c.expected}")
        if not c.held:
            print(f"         found: {c.found or 'nothing'}")
    print_judgement(summary, first.results, reproduce=False)  # a scenario's reproduce line follows
    if args.stats:
        print_stats(summary)
    if len(stories) > 1:
        print()
        for n, s in enumerate(stories, start=1):
            failed = [c.expected for c in s.checks if not c.held]
            broken = sorted({v.invariant for r in s.results for v in r.verdict.violations})
            print(f"{n:>3}. {WORD[s.verdict]}" + (f": {', '.join(broken)}" if broken else "")
                  + (f" (missing: {'; '.join(failed)})" if failed else ""))
        print("every verdict the same" if agree else
              "VERDICTS DIFFER: the outcome of this story depends on timing")
    missing = sum(1 for c in first.checks if not c.held)
    story = "the story held" if not missing else f"{missing} expected fact(s) missing"
    print(f"\nscenario {scenario.name}: {WORD[valid]} ({story}; {len(summary.results)} run(s)"
          + (f"; report: {summary.report}" if summary.report else "") + ")")
    if valid is not True:
        print(f"reproduce: {reproduce(args)}")
    if scenario.mutant and args.target == "reference":
        print(f"its rule broken: killpoint scenario {scenario.name} --target mutant:{scenario.mutant} "
              f"(must fail on {scenario.caught_by})")
