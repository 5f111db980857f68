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

from killpoint.chaos.points import DEFAULT_POINTS, ORDERED_POINTS, POINTS
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
    p.add_argument("--workload", default="orders", help="orders (default) or single")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--report-dir", default=None, help="where to write HTML reports")
    p.add_argument("--report", choices=("always", "on-failure", "never"), default="on-failure",
                   help="when to write HTML reports (default: on-failure)")


def parse_points(text: str | None, known: Iterable[str] = POINTS,
                 default: Iterable[str] = DEFAULT_POINTS) -> tuple[str, ...]:
    """The crash points named by ``--points`` (any of ``known``), or without it ``default`` (the
    points every store has: the PostgreSQL store's own are run only when asked for)."""
    known = tuple(p for p in ORDERED_POINTS if p in set(known)) + tuple(sorted(set(known) - set(ORDERED_POINTS)))
    if not text:
        return tuple(p for p in known if p in set(default))
    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in chosen if p not in known]
    if bad or not chosen:
        raise BadInput(f"--points: unknown crash point {', '.join(map(repr, bad)) or repr(text)}; "
                       f"valid names are {', '.join(known)}")
    return chosen


def run_config(args: argparse.Namespace, schedule, **overrides: Any) -> RunConfig:
    from killpoint.harness.targets import InvalidTarget, resolve
    from killpoint.harness.orders import WORKLOADS

    if args.workers < 1 or args.workers > 26:
        raise BadInput(f"--workers {args.workers}: use a number from 1 to 26")
    if args.workload not in WORKLOADS:
        raise BadInput(f"--workload {args.workload!r}: known workloads are {', '.join(WORKLOADS)}")
    target = getattr(args, "target", "reference")
    try:
        resolve(target)
    except InvalidTarget as exc:
        raise BadInput(str(exc)) from None
    validate_store(args.store, schedule)
    values = dict(schedule=schedule, target=target, workload=args.workload, workers=args.workers,
                  seed=args.seed, store=args.store, timing=Timing())
    values.update(overrides)
    return RunConfig(**values)


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
    if c.workload != "orders":
        parts += ["--workload", c.workload]
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
        checked: Counter[str] = Counter()
        violated: Counter[str] = Counter()
        names: list[str] = []
        for r in self.results:
            for res in r.verdict.results:
                if res.invariant not in names:
                    names.append(res.invariant)
                checked[res.invariant] += res.checked
                violated[res.invariant] += res.valid is False
        return {n: {"checked": checked[n], "violated": violated[n]} for n in names}

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
        raise BadInput(f"--report-dir {args.report_dir!r}: cannot write reports there "
                       f"({exc.strerror or exc})") from None


def print_judgement(summary: Summary, results: Sequence[RunResult], *, reproduce: bool = True) -> None:
    """The invariants table, then each violation (with its replay line) and each unknown reason."""
    print()
    print(f"{'invariant':<24} {'checked':>8} {'violated':>9}")
    for name, c in summary.invariants().items():
        print(f"{name:<24} {c['checked']:>8} {c['violated']:>9}")
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
    print(f"\n{len(summary.results)} runs, {fired}/{scheduled} scheduled faults fired: {verdict}"
          + (f"; report: {summary.report}" if summary.report else ""))
    return summary.exit_code()
