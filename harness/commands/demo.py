"""``killpoint demo``: a short tour of the main job on the embedded SQLite store.

Five schedules, each a crash at a telling moment of the order workflow; for each, what was killed
where, what recovery did, and what the fifteen invariants concluded. Then one caught bug: the reference
worker with its fence check left out (a mutant), under the lease takeover, so the first screen shows
what a violation and its reproduce line look like.

The exit code is the reference's verdict (0 when valid), and the shown mutant must be caught: it is
a demonstration whose violation is expected. Were it not caught, the checkers would have failed
their own proof, and the demo exits 1 (3 when its run could not be judged), as ``selftest`` does.
"""

from __future__ import annotations

import argparse
import sys

from killpoint import chaos, vocab
from killpoint.harness.colour import Colour
from killpoint.harness.commands.options import add_common, run_config, workload_of
from killpoint.harness.commands.output import finish
from killpoint.harness.commands.summary import EXIT_UNKNOWN, EXIT_VIOLATED, Summary, replay_command
from killpoint.harness.narrate import clock_legend, story
from killpoint.harness.run import Session

HELP = ("a short guided tour: crash the reference worker at five telling points and check the invariants, "
        "then show one caught bug")

# The bug the tour ends with: the reference worker with one rule broken, under the lease takeover
# (the tour's second run), and the invariant that must catch it.
MUTANT = ("mutant:no-fence-check", "A@charge.after_call:1*pause", "stale_writes_rejected",
          "The same takeover, with one bug: this worker commits without comparing its fence, so when A "
          "wakes up late its stale commit is accepted. killpoint must catch it.")

TOUR = (
    ("A@charge.after_call:kill",
     "The dangerous window: the payment provider charged the card, then the worker died before it "
     "wrote a receipt. Recovery must find the charge by its idempotency key, not charge again."),
    ("A@charge.after_call:1*pause",
     "Lease takeover: A is frozen (SIGSTOP) past its lease; B takes over with a higher fence; A wakes "
     "up late and its commit with the old fence must be refused."),
    ("A@notify.after_call:kill",
     "An unsafe activity: the legacy notifier has no keys and no receipts, so after a crash nobody "
     "knows whether the mail went out. The step must go to manual review and stay there."),
    ("A@charge.in_call:kill",
     "Inside the call: the downstream applied the charge, but the worker died before reading the answer."),
    ("A@charge.heartbeat:hang",
     "A stuck worker: its heartbeat goes on, its business thread hangs. The progress monitor must "
     "flag it within its bound so another worker can take over safely."),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)


def run(args: argparse.Namespace) -> int:
    workload = workload_of(args)
    configs = [(run_config(args, chaos.parse(text)), why) for text, why in TOUR]
    lines: list[str] = []
    out = (lambda s="": None) if args.json else print
    out(f"killpoint demo: the {args.target} worker, {args.workers} workers per run, store {args.store}, "
        f"seed {args.seed}")
    out(f"Workload {workload.name!r}:")
    for inst in workload.instances:
        d = inst.data
        out(f"  {inst.id}: {d.get('customer')} buys {d.get('qty')} x {d.get('sku')} for "
            f"{d.get('amount', 0) / 100:.2f} EUR ({d.get('kind')}); steps "
            + " -> ".join(s.name for s in inst.steps))
    out("Each run starts worker A alone, fires the fault, lets the other workers recover, then judges "
        "the whole history.")
    out(clock_legend(configs[0][0].virtual_time))
    summary = Summary()
    shown = args.target == "reference"  # the mutant is the reference with one rule broken
    with Session() as session:
        for n, (config, why) in enumerate(configs, start=1):
            result = session.run(config)
            summary.results.append(result)
            out()
            out(f"{n}. {config.schedule}")
            out(f"   {why}")
            for text in story(result):
                out(f"   {text}")
        mutant = None
        if shown:
            target, schedule, invariant, why = MUTANT
            from killpoint.harness.mutants import overrides_for

            mutant = session.run(run_config(args, chaos.parse(schedule), target=target, **overrides_for(target)))
    caught = mutant is not None and any(v.invariant == invariant for v in mutant.verdict.violations)
    extra = {}
    if mutant is not None:
        out()
        out(f"{len(configs) + 1}. {schedule} on {target}")
        out(f"   {why}")
        for text in story(mutant):
            out(f"   {text}")
        paint = Colour.for_stream(sys.stdout)
        for v in mutant.verdict.violations:
            out(f"   {paint.verdict(vocab.VERDICT_WORDS[False])} {v.invariant} at {v.instance}:{v.step}: {v.detail}")
        out(f"   reproduce: {replay_command(mutant)}")
        out(f"   => {'caught' if caught else 'NOT caught'}: this bug {'is' if caught else 'must be'} a violation of "
            f"{invariant}; a demonstration, it does not count against the tour's verdict below")
        extra["mutant"] = {"target": target, "schedule": schedule, "expected": invariant, "caught": caught,
                           "valid": mutant.valid, "violations": [v.to_json() for v in mutant.verdict.violations],
                           "reproduce": replay_command(mutant)}
    lines.append("\nWhat next: `killpoint matrix` runs every crash point at every step; add --json for CI.")
    code = finish(args, summary, "killpoint demo", lines, extra_json=extra)
    if mutant is None or caught:
        return code
    print(f"killpoint demo: the bug shown ({target} under {schedule}) was NOT caught by {invariant}: the "
          f"checkers failed their own proof", file=sys.stderr if args.json else sys.stdout)
    return EXIT_VIOLATED if code == EXIT_VIOLATED or mutant.valid is not None else EXIT_UNKNOWN
