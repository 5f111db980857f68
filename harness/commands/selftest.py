"""``killpoint selftest``: prove the checkers on every run of CI.

Each mutant runs under the schedule that shows its bug and must be reported by the invariant it
names; the reference runs the full single-crash matrix plus every mutant's schedule and must be
valid on all of them. The second half matters as much as the first: a schedule that also breaks
the reference would prove nothing about the mutant.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from killpoint import vocab
from killpoint import chaos
from killpoint.errors import BadInput, shown
from killpoint.harness.commands.options import (add_jobs, add_output, add_real_time, add_seed, jobs_of, run_config,
                                                validate_store)
from killpoint.harness.commands.output import print_stats, progress_for, say_stopped
from killpoint.harness.commands.summary import (EXIT_UNKNOWN, EXIT_VALID, EXIT_VIOLATED, Summary, replay_command,
                                                until_broken)

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult

HELP = ("run every mutant under its schedule and the reference on the single-crash matrix; "
        "print the mutation score (exit 0 only when every mutant is caught and the reference is valid)")
MAX_FAULTS = 2  # a counterexample a person can follow


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default="sqlite", help="sqlite (default) or a postgresql:// URL")
    add_seed(p)
    p.add_argument("--mutants", default=None,
                   help="comma-separated mutant names (default: all of them)")
    p.add_argument("--quick", action="store_true",
                   help="run the reference only on the mutants' schedules, not the full matrix")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_jobs(p)
    add_real_time(p, "turn the run clock off: real waits and short timings (see matrix --help)")
    p.set_defaults(workers=2, workload=None, target="reference")
    add_output(p)


@dataclass(frozen=True)
class MutantOutcome:
    name: str
    caught_by: str
    result: RunResult

    @property
    def violated(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v.invariant for v in self.result.verdict.violations))

    @property
    def faults(self) -> int:
        return len(self.result.config.schedule.faults)

    @property
    def caught(self) -> bool:
        return self.caught_by in self.violated and self.faults <= MAX_FAULTS

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "caught_by": self.caught_by, "caught": self.caught,
                "schedule": str(self.result.config.schedule), "faults": self.faults,
                "valid": self.result.valid, "violated": list(self.violated),
                "reproduce": replay_command(self.result)}


def _chosen(text: str | None) -> list[Any]:
    from killpoint.harness.mutants import MUTANTS

    from killpoint.harness.commands.options import _names

    if text is None:
        return list(MUTANTS.values())
    names = _names(text, "--mutants")  # an empty list is refused, as --points '' is, never all
    bad = [n for n in names if n not in MUTANTS]
    if bad:
        raise BadInput(f"--mutants: unknown mutant {', '.join(map(shown, bad))}; "
                       f"known mutants are {', '.join(MUTANTS)}")
    return [MUTANTS[n] for n in names]


def run(args: argparse.Namespace) -> int:
    from killpoint.chaos.generator import single_crash_schedules
    from killpoint.harness.commands.options import parse_schedule, workload_of
    from killpoint.harness.run import Session

    validate_store(args.store)
    mutants = _chosen(args.mutants)
    own_configs: list[Any] = []
    reference_configs: list[Any] = []
    reference_name = getattr(args, "target", "reference")
    for m in mutants:
        # Each run is configured as for its own target: a mutant of a target that owns its state has
        # its points, its workload, and a correct twin that must stay valid on the same schedule.
        for target, configs in ((m.target_name, own_configs), (m.reference or reference_name, reference_configs)):
            own = argparse.Namespace(**{**vars(args), "target": target})
            schedule = parse_schedule(own, m.schedule)
            if len(schedule.faults) > MAX_FAULTS:  # a zoo entry that breaks the rule
                raise BadInput(f"mutant {m.name!r}: its schedule {m.schedule!r} has more than {MAX_FAULTS} faults")
            configs.append(run_config(own, schedule, **m.run_overrides()))
    mutant_configs = list(zip(mutants, own_configs))
    if not args.quick:
        steps = workload_of(args).step_names
        reference_configs += [run_config(args, s)
                              for s in single_crash_schedules(steps, chaos.DEFAULT_POINTS)]
    progress = progress_for(args, len(mutant_configs) + len(reference_configs), "killpoint selftest")
    outcomes: list[MutantOutcome] = []
    reference = Summary()
    with Session() as session:
        configs = [c for _, c in mutant_configs] + reference_configs
        labels = [c.target_name for _, c in mutant_configs] + \
            [f"reference {c.schedule}" for c in reference_configs]
        if configs:
            progress.step(labels[0])  # at once: the first result may take a while
        broken: RunResult | None = None  # the run whose infrastructure failed: the command ends there
        for i, result in enumerate(until_broken(session.run_many(configs, jobs=jobs_of(args)))):
            if result.infrastructure is not None:
                broken = result
            if i < len(mutant_configs):
                m = mutant_configs[i][0]
                outcomes.append(MutantOutcome(m.name, m.caught_by, result))
            else:
                reference.results.append(result)
            progress.step(labels[i], result)
            if i + 1 < len(configs):
                progress.step(labels[i + 1])
    progress.close()
    if broken is not None:
        return _broken(args, broken, made=len(outcomes) + len(reference.results), planned=len(configs))

    caught = sum(o.caught for o in outcomes)
    ok = caught == len(outcomes) and reference.valid is True
    _junit(args, outcomes, reference)
    if args.json:
        _print_json(outcomes, reference, caught, ok)
        return EXIT_VALID if ok else EXIT_VIOLATED
    print(table(outcomes))
    word = vocab.VERDICT_WORDS[reference.valid]
    scope = ("the mutants' schedules only" if args.quick
             else "the single-crash matrix and every mutant's schedule")
    print(f"\nreference: {word} on {len(reference.results)} runs ({scope})")
    for r in reference.results:
        for v in r.verdict.violations:
            print(f"  VIOLATED {v.invariant} at {v.instance}:{v.step} under {r.schedule or 'no faults'}: {v.detail}")
            print(f"    reproduce: {replay_command(r)}")
        if r.valid is None:
            print(f"  UNKNOWN under {r.schedule or 'no faults'}: {'; '.join(r.verdict.unknown_reasons)}")
    if args.stats:
        print_stats(Summary(results=[o.result for o in outcomes] + reference.results))
    print(f"\nmutation score: {caught}/{len(outcomes)} mutants caught by their named invariant"
          f"{'' if ok else '  -- SELFTEST FAILED'}")
    return EXIT_VALID if ok else EXIT_VIOLATED


def _broken(args: argparse.Namespace, result: RunResult, *, made: int, planned: int) -> int:
    """A run's infrastructure failed (the store, the downstream, the disk): no score, since a mutant
    not caught or a reference not valid would say nothing of the checkers. Exit 3 with the cause,
    as the matrix ends at one."""
    cause = result.infrastructure
    say_stopped(made, planned, cause or "")
    if args.json:
        # The keys of the scored JSON, with no score: what ran is not evidence for or against
        print(json.dumps({"valid": None, "runs": made, "score": None, "mutants": [], "reference": None,
                          "violations": [], "report": None, "infrastructure_failure": cause,
                          "not_run": planned - made}, indent=2))
    else:
        print(f"\nUNKNOWN {result.schedule or 'no faults'} ({result.config.target_name}): {cause}")
        print("mutation score: none (the infrastructure failed)")
    return EXIT_UNKNOWN


def _print_json(outcomes: list[MutantOutcome], reference: Summary, caught: int, ok: bool) -> None:
    """``--json``: the score, each mutant's outcome and the reference's verdict, in one object."""
    from killpoint.harness.stats import total

    out = reference.to_json()
    out.pop("results", None)
    # The crash points reached and fired, as matrix's JSON has them: each mutant's run, the
    # reference's runs, and the whole.
    stats = Summary(results=[o.result for o in outcomes]).point_stats()
    print(json.dumps({
        "valid": ok, "runs": len(outcomes) + len(reference.results),
        "score": {"caught": caught, "mutants": len(outcomes)},
        "mutants": [{**o.to_json(), "points": s.to_json()} for o, s in zip(outcomes, stats)],
        "reference": {"valid": reference.valid, "runs": len(reference.results),
                      "violations": out["violations"], "unknown": out["unknown"],
                      "points": out["points"]},
        "violations": out["violations"], "invariants": out["invariants"], "report": None,
        "points": total(stats + reference.point_stats()).to_json(),
    }, indent=2))


def _junit(args: argparse.Namespace, outcomes: list[MutantOutcome], reference: Summary) -> None:
    """``--junit-xml``: a case per run; a mutant's passes when its named invariant caught it."""
    if not args.junit_xml:
        return
    from killpoint.harness.commands.output import write_junit_file

    write_junit_file(args.junit_xml, [o.result for o in outcomes] + reference.results,
                     suite="killpoint selftest", reproduce=replay_command,
                     expect=[o.caught_by for o in outcomes] + [None] * len(reference.results))


def table(outcomes: list[MutantOutcome]) -> str:
    """The mutation-score table: one row per mutant, as the README shows it."""
    rows = [("mutant", "caught by", "schedule", "caught", "also violated")]
    for o in outcomes:
        also = ", ".join(v for v in o.violated if v != o.caught_by) or "-"
        mark = "yes" if o.caught else ("NO: too many faults" if o.caught_by in o.violated else "NO")
        rows.append((o.name, o.caught_by, str(o.result.config.schedule) or "(no faults)", mark, also))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * len(rows[0][-1]))
    return "\n".join(line.rstrip() for line in lines)


