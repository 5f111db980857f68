"""The verdict over one or more crash runs, as a test sees it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from killpoint.harness.checkers.base import Violation
    from killpoint.harness.run import RunResult

@dataclass(frozen=True)
class _Run:
    """What a verdict keeps of one run: enough to explain it and to reproduce it."""

    schedule: str
    valid: bool | None
    violations: tuple["Violation", ...]
    unknown: tuple[str, ...]
    reproduce: str
    report: str | None
    note: str = ""  # e.g. why the reproduce command cannot name the target


@dataclass(frozen=True)
class CrashVerdict:
    """The verdict over one or more crash runs: valid is True, False, or None (unknown).

    Unknown -- a run that could not be judged, such as a scheduled fault that never fired -- is never
    valid: ``assert_valid`` fails on it too. Don't write ``assert verdict`` (a verdict has no truth
    value); write ``verdict.assert_valid()`` or test ``verdict.valid``.
    """

    valid: bool | None
    runs: int
    # Every run with its history (of an exploration: its counterexample and its unknown runs).
    results: tuple["RunResult", ...] = field(repr=False)
    report_path: str | None  # HTML report of the first run that was not valid (else the first run)
    target: str
    seed: int
    _runs: tuple[_Run, ...] = field(default=(), repr=False)
    # What the runs' faults provoked (killpoint.harness.exercise.Tally), and why the runs together
    # are unknown whatever each one's verdict (no pause exercised a takeover, an expectation of
    # killpoint.sometimes never reached).
    exercise: Any = field(default=None, repr=False)
    whole_reasons: tuple[str, ...] = ()

    @property
    def violations(self) -> tuple["Violation", ...]:
        """Every violation of every run; each names its invariant, instance, step and schedule."""
        return tuple(v for r in self._runs for v in r.violations)

    @property
    def unknown_reasons(self) -> tuple[str, ...]:
        return tuple(f"{r.schedule or 'no faults'}: {why}" for r in self._runs for why in r.unknown) + \
            tuple(f"all runs: {why}" for why in self.whole_reasons)

    @property
    def reproduce(self) -> tuple[str, ...]:
        """The command that reproduces each run that was not valid."""
        return tuple(r.reproduce for r in self._runs if r.valid is not True)

    def __bool__(self) -> bool:
        raise TypeError("a CrashVerdict has no truth value (it may be unknown): use "
                        "verdict.assert_valid() or compare verdict.valid with True, False or None")

    def explain(self, why: str = "") -> str:
        """The failure message: each violated invariant with its schedule and reproduce command."""
        bad = [r for r in self._runs if r.valid is not True]
        violated = sum(1 for r in bad if r.valid is False)
        runs = f"{self.runs} crash run{'s' if self.runs != 1 else ''}"
        head = (f"killpoint: {violated} of {runs} violated an invariant" if violated else
                f"killpoint: {len(bad)} of {runs} could not be judged, so the verdict is unknown" if bad else
                f"killpoint: the {runs} together did not exercise what they had to, so the verdict is unknown")
        lines = [f"{head} (target {self.target}, seed {self.seed})" + (f"; {why}" if why else "")]
        for r in bad:
            if r.violations:
                names = ", ".join(dict.fromkeys(v.invariant for v in r.violations))
                lines += ["", f"VIOLATED {names} under {r.schedule or 'no faults'}"]
                lines += [f"  {v.invariant} at {v.instance}:{v.step}: {v.detail}" for v in r.violations]
            else:
                lines += ["", f"UNKNOWN under {r.schedule or 'no faults'}"]
                lines += [f"  {reason}" for reason in r.unknown or ("the verdict is unknown",)]
            lines += _tail(r)
        for reason in self.whole_reasons:
            lines += ["", f"UNKNOWN over all runs: {reason}"]
        if self.exercise is not None and self.exercise.line():
            lines += ["", f"exercised: {self.exercise.line()}"]
        return "\n".join(lines)

    def assert_valid(self) -> None:
        """Fail (AssertionError) unless every run was valid, naming what was violated and how to replay it."""
        __tracebackhide__ = True
        if self.valid is not True:
            raise AssertionError(self.explain())


def _tail(r: _Run) -> list[str]:
    lines = [f"  reproduce: {r.reproduce}"]
    if r.note:
        lines.append(f"  ({r.note})")
    if r.report:
        lines.append(f"  report: {r.report}")
    return lines


def _verdict(runs: Sequence[_Run], results: Sequence["RunResult"], target: str, seed: int, *,
             total: int | None = None, exercise: Any = None) -> CrashVerdict:
    """Rank the runs (False > None > True); no runs at all is unknown, never valid. ``exercise``:
    what the runs' faults provoked (default: counted over ``results``); runs that together
    exercised nothing they had to are unknown (:func:`killpoint.harness.exercise.matrix_reasons`)."""
    from killpoint.harness.checkers.base import rank
    from killpoint.harness.exercise import matrix_reasons, total as total_of

    total = len(runs) if total is None else total
    valid = (rank(r.valid for r in runs) if runs else True) if total else None
    tally = total_of(r.exercise for r in results) if exercise is None else exercise
    whole = matrix_reasons(tally) if total else ()
    if valid is True and whole:
        valid = None
    first_bad = next((r for r in runs if r.valid is not True and r.report), None)
    report = first_bad.report if first_bad else next((r.report for r in runs if r.report), None)
    return CrashVerdict(valid, total, tuple(results), report, target, seed, tuple(runs), tally, whole)
