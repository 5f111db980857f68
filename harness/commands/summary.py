"""What a command's runs came to: the :class:`Summary` of their results, its JSON and exit code.

Every command that runs keeps its results here, whatever it prints: the verdict over all runs, the
invariants table, what the faults provoked, the target's errors, the crash points reached. How a
summary is shown is :mod:`~killpoint.harness.commands.output`'s.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from killpoint.harness.redact import redact
from killpoint.harness.run import RunResult
from killpoint.harness.stats import PointStats
from killpoint.harness.stats import total as total_stats

if TYPE_CHECKING:
    from killpoint.harness.exercise import Tally

EXIT_VALID, EXIT_VIOLATED, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3


def replay_command(result: RunResult) -> str:
    """The one line that reproduces a run (:meth:`RunConfig.reproduce_command`)."""
    return result.config.reproduce_command()


def until_broken(results: Iterator[RunResult]) -> Iterator[RunResult]:
    """``results`` up to and including the first run whose infrastructure broke (the store lost or
    silent, the downstream silent, the disk full): the runs after it would meet the same failure,
    each after its own timeouts, and a command that went on would hold a CI job for as many. The
    runs in hand are ended as an interruption ends them (``results`` is closed)."""
    try:
        for result in results:
            yield result
            if result.infrastructure is not None:
                return
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()


@dataclass
class Summary:
    results: list[RunResult] = field(default_factory=list)
    planned: int | None = None  # the runs the command meant to make (more than made: it stopped)
    report: str | None = None
    report_error: str | None = None  # why the reports asked for could not be written
    report_pages: bool = True  # False: the index alone was written (every run valid, --report on-failure)
    junit_error: str | None = None  # why the --junit-xml file could not be written
    # The matrix's path exploration (harness.paths.Exploration): the later hits it found and crashed.
    exploration: Any = None
    # The point statistics of runs whose events were let go (see add), by the result's id.
    _points: dict[int, PointStats] = field(default_factory=dict, repr=False)
    # The report pages written as the runs come (killpoint.reports.PagesAsTheyCome), when a
    # command asked for them with stream_pages: every run must then go through add.
    pages: Any = None

    def add(self, result: RunResult, *, keep_events: bool = True) -> None:
        """Keep a run's result. Without ``keep_events`` (nothing will draw this run: no report is
        asked for), a valid run keeps its verdict, faults, points reached and history's summary but
        lets its events go: a matrix's histories otherwise grow this process's heap by tens of MiB,
        which every worker forked from it pays for in page tables and copy-on-write faults. With
        pages written as the runs come, the run goes to them (which write its page now, or hold it
        until pages are known to be wanted) and is kept here as without ``keep_events``."""
        if self.pages is not None:
            self.pages.add(result)
            keep_events = False
        if not keep_events and result.valid is True:
            points = PointStats.of(result.history)
            result = dataclasses.replace(result, history=dataclasses.replace(result.history, events=()))
            self._points[id(result)] = points
        self.results.append(result)

    @property
    def valid(self) -> bool | None:
        from killpoint.harness.checkers.base import rank

        if not self.results:
            return None
        valid = rank(r.valid for r in self.results)
        return None if valid is True and self.reasons() else valid

    def exercise(self) -> "Tally":
        """What the runs' faults provoked, over all of them (:mod:`killpoint.harness.exercise`)."""
        from killpoint.harness.exercise import total

        return total(r.exercise for r in self.results)

    def target_errors(self) -> list[tuple[str, int]]:
        """What the target's hooks did wrong (a history() of unknown kinds or bad fields, a hook
        that raised), each with the number of runs it happened in: said once per command, also
        where the runs came out violated (the cause was once only in each run's HTML)."""
        counts: Counter[str] = Counter()
        for r in self.results:
            counts.update(dict.fromkeys(r.target_errors, 1))
        return list(counts.items())

    def reasons(self) -> tuple[str, ...]:
        """Why the runs together are unknown whatever each one's verdict: no pause exercised a
        takeover, or a declared expectation (killpoint.sometimes) was never reached."""
        from killpoint.harness.exercise import matrix_reasons

        return matrix_reasons(self.exercise())

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

    @property
    def infrastructure(self) -> str | None:
        """Why the infrastructure broke in a run, or None."""
        return next((r.infrastructure for r in self.results if r.infrastructure is not None), None)

    @property
    def not_run(self) -> int:
        """The runs planned and not made: the command stopped at an infrastructure failure."""
        return max(0, (self.planned or 0) - len(self.results))

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
            **({"report_error": self.report_error} if self.report_error else {}),
            **({"junit_error": self.junit_error} if self.junit_error else {}),
            **({"hits": self.hits()} if self.exploration is not None else {}),
            "unknown": [{"schedule": str(r.config.schedule), "reasons": list(r.verdict.unknown_reasons)}
                        for r in self.results if r.valid is None],
            "unknown_reasons": list(dict.fromkeys([*self.reasons(), *(
                reason for r in self.results if r.valid is None for reason in r.verdict.unknown_reasons)])),
            "exercise": self.exercise().to_json(),
            "target_errors": [{"error": e, "runs": n} for e, n in self.target_errors()],
            "results": [{"schedule": str(r.config.schedule), "target": r.config.target_name,
                         "valid": r.valid, "fired": r.fired, "unfired": list(r.unfired),
                         "workers_spawned": r.spawned, "duration_ms": round(r.duration_s * 1000, 1),
                         "run_id": r.run_id, "seed": r.config.seed, "store": redact(r.config.store),
                         "points": s.to_json(),
                         "exercise": r.exercise.to_json() if r.exercise is not None else None}
                        for r, s in zip(self.results, self.point_stats())],
            "points": total_stats(self.point_stats()).to_json(),
            **({"infrastructure_failure": self.infrastructure, "not_run": self.not_run}
               if self.infrastructure is not None else {}),
        }

    def hits(self) -> dict[str, Any]:
        """The path exploration's counts: the hits the fault-free run reached, the later ones
        crashed (``explored``), those the bound left, and those a run never reached (``never_fired``:
        each of those runs is unknown)."""
        crashed = {str(s) for s in self.exploration.schedules}
        never = sum(1 for r in self.results if str(r.config.schedule) in crashed and r.unfired)
        return self.exploration.to_json(never)

    def point_stats(self) -> list[PointStats]:
        """The crash points each run reached and fired (see :mod:`harness.stats`)."""
        return [self._points[id(r)] if id(r) in self._points else PointStats.of(r.history)
                for r in self.results]
