"""``killpoint mutants``: the mutant zoo, each broken rule with the invariant that must catch it."""

from __future__ import annotations

import argparse
import json

from killpoint.harness.commands.summary import EXIT_VALID

HELP = "list the built-in mutants: the rule each one breaks and the invariant that must catch it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of objects with name, breaks, caught_by, schedule")


def run(args: argparse.Namespace) -> int:
    from killpoint.harness.mutants import MUTANTS

    if args.json:
        print(json.dumps([{"name": m.name, "breaks": m.breaks, "caught_by": m.caught_by,
                           "schedule": m.schedule} for m in MUTANTS.values()], indent=2))
        return EXIT_VALID
    width = max(len(m.name) for m in MUTANTS.values())
    for m in MUTANTS.values():
        print(f"mutant:{m.name:<{width}}  caught by {m.caught_by}")
        print(f"  {'':<{width + 7}}breaks: {m.breaks}")
        print(f"  {'':<{width + 7}}shown by: {m.schedule or 'no faults'}")
    print(f"\n{len(MUTANTS)} mutants; `killpoint selftest` checks that each one is caught.")
    return EXIT_VALID
