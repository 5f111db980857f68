"""What a checker returns, and how results compose into a verdict.

A checker is a pure function ``History -> Result``. Valid is three-valued: True, False, or None
(unknown: the checker could not judge). Verdicts rank False > None > True, and a checker that raises
gives None, never True.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from killpoint.harness.history import History


@dataclass(frozen=True)
class Violation:
    invariant: str
    instance: str | None
    step: str | None
    detail: str
    events: tuple[int, ...] = ()  # indexes into History.events that prove it
    schedule: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"invariant": self.invariant, "schedule": self.schedule, "instance": self.instance,
                "step": self.step, "detail": self.detail, "events": list(self.events)}


@dataclass(frozen=True)
class Result:
    invariant: str
    valid: bool | None
    checked: bool  # the history had something for this invariant to judge
    violations: tuple[Violation, ...] = ()
    detail: str = ""
    # False: the run had no source this invariant reads (a target that owns its state gave it no
    # events); it judged nothing and counts neither as checked nor as evidence for a valid verdict.
    applicable: bool = True

    @property
    def judged(self) -> bool:
        return self.applicable and self.checked


Checker = Callable[[History], Result]


def rank(values: Iterable[bool | None]) -> bool | None:
    """Combine validities: any False wins, then any None, else True."""
    values = list(values)
    if any(v is False for v in values):
        return False
    if any(v is None for v in values):
        return None
    return True


@dataclass(frozen=True)
class Verdict:
    valid: bool | None
    results: tuple[Result, ...] = ()
    unknown_reasons: tuple[str, ...] = field(default=())

    @property
    def violations(self) -> tuple[Violation, ...]:
        return tuple(v for r in self.results for v in r.violations)

    @property
    def judged(self) -> int:
        """How many invariants had something to judge in this run."""
        return sum(1 for r in self.results if r.judged)

    @property
    def not_applicable(self) -> tuple[str, ...]:
        return tuple(r.invariant for r in self.results if not r.applicable)
