"""``killpoint demo``: a short tour of the main job on the embedded SQLite store.

Five schedules, each a crash at a telling moment of the order workflow; for each, what was killed
where, what recovery did, and what the fifteen invariants concluded.
"""

from __future__ import annotations

import argparse

from killpoint import chaos
from killpoint.harness.commands.common import Summary, add_common, finish, run_config, workload_of
from killpoint.harness.narrate import story
from killpoint.harness.run import Session

HELP = "a short guided tour: crash the reference worker at five telling points and check the invariants"

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
    summary = Summary()
    with Session() as session:
        for n, (config, why) in enumerate(configs, start=1):
            result = session.run(config)
            summary.results.append(result)
            out()
            out(f"{n}. {config.schedule}")
            out(f"   {why}")
            for text in story(result):
                out(f"   {text}")
    lines.append("\nWhat next: `killpoint matrix` runs every crash point at every step; add --json for CI.")
    return finish(args, summary, "killpoint demo", lines)
