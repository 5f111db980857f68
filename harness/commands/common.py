"""What every command shares: options, bad-input errors, the summary, JSON, exit codes, progress."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from killpoint.chaos.points import DB_POINTS, DEFAULT_POINTS, ORDERED_POINTS, POINTS
from killpoint.errors import BadInput
from killpoint.harness.run import RunConfig, RunResult
from killpoint.harness.worker import Timing

EXIT_VALID, EXIT_VIOLATED, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3


def add_common(p: argparse.ArgumentParser, *, target: bool = True) -> None:
    if target:
        p.add_argument("--target", default="reference",
                       help="reference, mutant:NAME or pkg.module:function (default: reference)")
    p.add_argument("--store", default="sqlite", help="sqlite (default) or a postgresql:// URL")
    p.add_argument("--workers", type=int, default=2, help="worker processes per run (default: 2)")
    p.add_argument("--seed", type=int, default=0, help="seed for the workload data and every draw")
    p.add_argument("--workload", default=None,
                   help="orders, single, plain or pkg.module:function (default: the target's own, else "
                        "orders for reference and mutants, plain for your own target)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--report-dir", default=None, help="where to write HTML reports")
    p.add_argument("--report", choices=("always", "on-failure", "never"), default="on-failure",
                   help="when to write HTML reports (default: on-failure)")


SHOWN_LIMIT = 200  # characters of a bad value an error message repeats


def shown(value: object) -> str:
    """A value as an error message names it: quoted, and clipped to 200 characters (a 10 kB bad
    value is named, not echoed back whole)."""
    text = repr(value) if isinstance(value, str) else repr(str(value))
    if len(text) <= SHOWN_LIMIT:
        return text
    return f"{text[:SHOWN_LIMIT]}... ({len(str(value))} characters)"


def one_line(message: str, limit: int = 800) -> str:
    """An error message as one line, no word of it longer than 200 characters and the whole no
    longer than ``limit``: the last guard against a long value that a message quoted whole."""
    words = [w if len(w) <= SHOWN_LIMIT else f"{w[:SHOWN_LIMIT]}...({len(w)} characters)"
             for w in message.split()]
    line = " ".join(words)
    return line if len(line) <= limit else line[:limit] + "..."


def _names(text: str, option: str) -> tuple[str, ...]:
    """The comma-separated names of an option given explicitly: an empty list is bad input, never
    a quiet "all" (leaving the option out is how to ask for all)."""
    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    if not chosen:
        raise BadInput(f"{option} {shown(text)}: name at least one, or leave {option} out for all")
    return chosen


def parse_steps(text: str | None, known: Iterable[str]) -> tuple[str, ...]:
    """The steps named by ``--steps`` (any of ``known``), or without it all of ``known``."""
    known = tuple(known)
    if text is None:
        return known
    chosen = _names(text, "--steps")
    bad = [s for s in chosen if s not in known]
    if bad:
        raise BadInput(f"--steps: unknown step {', '.join(map(shown, bad))}; "
                       f"the workload's steps are {', '.join(known)}")
    return chosen


def parse_points(text: str | None, known: Iterable[str] = POINTS,
                 default: Iterable[str] = DEFAULT_POINTS) -> tuple[str, ...]:
    """The crash points named by ``--points`` (any of ``known``), or without it ``default`` (the
    points every store has: the PostgreSQL store's own are run only when asked for)."""
    known = tuple(p for p in ORDERED_POINTS if p in set(known)) + tuple(sorted(set(known) - set(ORDERED_POINTS)))
    if text is None:
        return tuple(p for p in known if p in set(default))
    chosen = _names(text, "--points")
    bad = [p for p in chosen if p not in known]
    if bad:
        raise BadInput(f"--points: unknown crash point {', '.join(map(shown, bad))}; "
                       f"valid names are {', '.join(known)}")
    return chosen


def declared_target(args: argparse.Namespace):
    """The ``--target`` with its declaration, or a one-line :class:`BadInput`."""
    from killpoint.harness.targets import InvalidTarget, declared

    try:
        return declared(getattr(args, "target", "reference"))
    except InvalidTarget as exc:
        raise BadInput(str(exc)[:400]) from None


def workload_name(args: argparse.Namespace) -> str:
    """``--workload``, or the target's default: its declared one, ``orders`` for the reference and
    the mutants (their traps are what they are judged on), ``plain`` for a user's own target."""
    from killpoint.harness.workload import default_for

    if getattr(args, "workload", None):
        return args.workload
    target = declared_target(args)
    return default_for(getattr(args, "target", "reference"), target)


def workload_of(args: argparse.Namespace):
    """The run's workload, built (and so checked) once, or a one-line :class:`BadInput`."""
    from killpoint.harness.workload import InvalidWorkload, resolve_workload

    try:
        return resolve_workload(workload_name(args), args.seed)
    except InvalidWorkload as exc:
        raise BadInput(f"--{str(exc)[:400]}") from None


def target_points(args: argparse.Namespace, text: str | None) -> tuple[str, ...]:
    """The crash points a command enumerates: ``text`` (``--points``) or the target's declared ones,
    always among those it declared (a point never declared is never scheduled)."""
    target = declared_target(args)
    if tuple(target.points) == tuple(DEFAULT_POINTS):
        return parse_points(text)  # a plain target: the built-in points, the store's own on request
    if text is None:
        return tuple(target.points)
    chosen = _names(text, "--points")
    bad = [p for p in chosen if p not in target.points]
    if bad:
        raise BadInput(f"--points: unknown crash point {', '.join(map(shown, bad))}; "
                       f"the target declares {', '.join(target.points)}")
    return chosen


def parse_schedule(args: argparse.Namespace, text: str):
    """A schedule's text, with the target's declared points as well as the built-in ones (a point
    the target did not declare is refused by :func:`run_config`, naming the ones it did)."""
    from killpoint import chaos

    points = frozenset(declared_target(args).points) | frozenset(DB_POINTS)
    try:
        return chaos.parse(text, points=points)
    except chaos.InvalidSchedule as exc:
        raise BadInput(f"schedule {shown(text)}: {one_line(str(exc), 400)}") from None


def run_config(args: argparse.Namespace, schedule, **overrides: Any) -> RunConfig:
    if args.workers < 1 or args.workers > 26:
        raise BadInput(f"--workers {args.workers}: use a number from 1 to 26")
    target = getattr(args, "target", "reference")
    declared = declared_target(args)
    workload = workload_name(args)
    steps = workload_of(args).step_names  # checked before any run starts
    if schedule is not None:
        check_schedule(schedule, steps=steps, workers=args.workers)
        undeclared = [str(f) for f in schedule.faults
                      if f.point not in declared.points and f.point not in DB_POINTS]
        if undeclared:
            raise BadInput(f"schedule {shown(str(schedule))}: {', '.join(map(shown, undeclared))} names a crash point "
                           f"the target does not declare; it declares {', '.join(declared.points)}")
    validate_store(args.store, schedule)
    values = dict(schedule=schedule, target=target, workload=workload, workers=args.workers,
                  seed=args.seed, store=args.store, timing=Timing())
    values.update(overrides)
    return RunConfig(**values)


def check_schedule(schedule, *, steps: Iterable[str], workers: int) -> None:
    """Refuse a schedule whose fault could never fire: a step the workload does not have, or a
    worker no run with ``workers`` workers ever starts (the first ones, then fresh identities for
    replacements up to the run's spawn cap)."""
    from killpoint.harness.supervise import reachable_identities

    steps = tuple(steps)
    for fault in schedule.faults:
        if fault.step is not None and fault.step not in steps:
            raise BadInput(f"schedule {shown(str(schedule))}: unknown step {shown(fault.step)} in "
                           f"{shown(str(fault))}; the workload's steps are {', '.join(steps)}")
    reachable = reachable_identities(workers, len(schedule.faults))
    for fault in schedule.faults:
        if fault.worker not in reachable:
            raise BadInput(f"schedule {shown(str(schedule))}: worker {shown(fault.worker)} in "
                           f"{shown(str(fault))} is never started: with --workers {workers} a run "
                           f"starts {', '.join(reachable[:workers])}, and replacements "
                           f"{reachable[workers]}..{reachable[-1]}")


def validate_store(spec: str, schedule=None) -> None:
    """Refuse a store we cannot use, or one that cannot carry out a fault of ``schedule``."""
    from killpoint.harness.store import InvalidStore, check_faults, check_store

    try:
        check_store(spec)
        check_faults(spec, schedule)
    except InvalidStore as exc:
        raise BadInput(str(exc)) from None


def redact(url: str) -> str:
    """A store URL with its password replaced, for anything printed or saved."""
    return re.sub(r"(://[^:/@]+:)[^@/]*@", r"\1***@", url)


def replay_command(result: RunResult) -> str:
    """The one line that reproduces a run: shell-quoted, the store password redacted."""
    c = result.config
    parts = ["killpoint", "replay", str(c.schedule), "--target", c.target_name, "--seed", str(c.seed)]
    if c.workers != 2:
        parts += ["--workers", str(c.workers)]
    if c.workload_name != RunConfig(target=c.target).workload_name:  # not the target's default
        parts += ["--workload", c.workload_name]
    if c.store != "sqlite":
        parts += ["--store", redact(c.store)]
    if c.same_identity != 0.5:  # the restart rule decides who recovers: it is part of the run
        parts += ["--same-identity", f"{c.same_identity:g}"]
    return " ".join(shlex.quote(p) for p in parts)


@dataclass
class Summary:
    results: list[RunResult] = field(default_factory=list)
    report: str | None = None

    @property
    def valid(self) -> bool | None:
        from killpoint.harness.checkers.base import rank

        return rank(r.valid for r in self.results) if self.results else None

    def exit_code(self) -> int:
        v = self.valid
        return EXIT_VALID if v is True else EXIT_VIOLATED if v is False else EXIT_UNKNOWN

    def invariants(self) -> dict[str, dict[str, int]]:
        """Per invariant, the runs in which it judged something (``checked``), found a violation,
        or could not judge at all (``not_applicable``: a target that owns its state gave it nothing)."""
        checked: Counter[str] = Counter()
        violated: Counter[str] = Counter()
        na: Counter[str] = Counter()
        names: list[str] = []
        for r in self.results:
            for res in r.verdict.results:
                if res.invariant not in names:
                    names.append(res.invariant)
                checked[res.invariant] += res.judged
                violated[res.invariant] += res.valid is False
                na[res.invariant] += not res.applicable
        return {n: {"checked": checked[n], "violated": violated[n], "not_applicable": na[n]}
                for n in names}

    def judged(self) -> tuple[int, int]:
        """(invariants that judged something in some run, invariants in all)."""
        table = self.invariants()
        return sum(1 for c in table.values() if c["checked"]), len(table)

    def to_json(self) -> dict[str, Any]:
        violations = []
        for r in self.results:
            for v in r.verdict.violations:
                violations.append({**v.to_json(), "schedule": str(r.config.schedule),
                                   "reproduce": replay_command(r)})
        return {
            "valid": self.valid,
            "runs": len(self.results),
            "violations": violations,
            "invariants": self.invariants(),
            "judged": self.judged()[0],
            "report": self.report,
            "unknown": [{"schedule": str(r.config.schedule), "reasons": list(r.verdict.unknown_reasons)}
                        for r in self.results if r.valid is None],
            "results": [{"schedule": str(r.config.schedule), "target": r.config.target_name,
                         "valid": r.valid, "fired": r.fired, "unfired": list(r.unfired),
                         "workers_spawned": r.spawned, "duration_ms": round(r.duration_s * 1000, 1),
                         "run_id": r.run_id} for r in self.results],
        }


class Progress:
    """A one-line progress bar on a terminal; silent otherwise (and always with --json)."""

    def __init__(self, total: int, enabled: bool):
        self.total = total
        self.enabled = enabled and sys.stderr.isatty()
        self.done = 0

    def step(self, label: str, result: RunResult | None = None) -> None:
        if result is not None:
            self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / max(1, self.total))
        mark = "" if result is None else {True: " ok", False: " VIOLATED", None: " unknown"}[result.valid]
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                         f"{label[:50]:<50}{mark:<10}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def write_reports(args: argparse.Namespace, summary: Summary, title: str) -> None:
    """Write the HTML index and run reports when asked (reports are optional until built)."""
    if args.report == "never" or args.report_dir is None:
        return
    if args.report == "on-failure" and summary.valid is True:
        return
    from killpoint.reports import write_reports as write

    try:
        summary.report = write(summary.results, args.report_dir, title=title)
    except OSError as exc:
        raise BadInput(f"--report-dir {shown(args.report_dir)}: cannot write reports there "
                       f"({exc.strerror or exc})") from None


def print_judgement(summary: Summary, results: Sequence[RunResult], *, reproduce: bool = True) -> None:
    """The invariants table, then each violation (with its replay line) and each unknown reason."""
    print()
    table = summary.invariants()
    na_column = any(c["not_applicable"] for c in table.values())
    print(f"{'invariant':<24} {'checked':>8} {'violated':>9}" + (f" {'n/a':>5}" if na_column else ""))
    for name, c in table.items():
        print(f"{name:<24} {c['checked']:>8} {c['violated']:>9}"
              + (f" {c['not_applicable']:>5}" if na_column else ""))
    if na_column:
        print("n/a: runs in which the invariant was not applicable (the target owns its state and "
              "gave it nothing to judge)")
    for r in results:
        where = r.config.schedule or "no faults"
        for v in r.verdict.violations:
            print(f"\nVIOLATED {v.invariant} at {v.instance}:{v.step} under {where}")
            print(f"  {v.detail}")
            if reproduce:
                print(f"  reproduce: {replay_command(r)}")
        if r.valid is None:
            for reason in r.verdict.unknown_reasons:
                print(f"\nUNKNOWN {where}: {reason}")


def finish(args: argparse.Namespace, summary: Summary, title: str, lines: Sequence[str] = ()) -> int:
    """Print the outcome (text or JSON) and return the exit code."""
    write_reports(args, summary, title)
    if args.json:
        print(json.dumps(summary.to_json(), indent=2))
        return summary.exit_code()
    for line in lines:
        print(line)
    print_judgement(summary, summary.results)
    verdict = {True: "valid", False: "INVALID", None: "unknown"}[summary.valid]
    fired = sum(1 for r in summary.results for n in r.fired.values() if n)
    scheduled = sum(len(r.fired) for r in summary.results)
    judged, total = summary.judged()
    print(f"\n{len(summary.results)} runs, {fired}/{scheduled} scheduled faults fired, "
          f"{judged} of {total} invariants judged: {verdict}"
          + (f"; report: {summary.report}" if summary.report else ""))
    return summary.exit_code()
