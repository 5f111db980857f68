"""What every scenario shares: the story it tells and the facts it checks.

A :class:`Story` collects a scenario's runs, its narrated lines and its checks. A check states a
fact the story must show ("A's commit with fence 1 was refused"); when it does not hold, the
scenario fails and says what it expected and what it found instead.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Iterable, TypeVar

from killpoint import chaos, vocab
from killpoint.errors import InvalidEvent
from killpoint.harness.checkers.base import rank
from killpoint.harness.events import TypedEvent
from killpoint.harness.history import Event
from killpoint.harness.narrate import clock_legend, narrate, verdict_line
from killpoint.harness.run import RunConfig, RunResult, Session
from killpoint.harness.worker import ReferenceWorker

WORD = vocab.VERDICT_WORDS

_F = TypeVar("_F")  # a family of typed events


@dataclass(frozen=True)
class Check:
    """One fact a story must show."""

    expected: str
    held: bool
    found: str = ""  # what was found instead, when it did not hold (or a detail when it did)
    run: int = 0  # the run (1-based) it was checked on; 0 for a fact that needs no run

    def to_json(self) -> dict[str, Any]:
        return {"expected": self.expected, "held": self.held, "found": self.found, "run": self.run}


@dataclass
class Story:
    """A scenario's runs, what it says about them, and the facts it checked."""

    name: str
    results: list[RunResult] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    told_clock: bool = False

    def say(self, text: str = "") -> None:
        self.lines.append(text)

    def run(self, session: Session, config: RunConfig, title: str,
            steps: Iterable[tuple[str, str]]) -> RunResult:
        """Run one configuration, then narrate the given steps and what the harness did."""
        result = session.run(config)
        self.results.append(result)
        self.say()
        self.say(f"{title}")
        self.say(f"  schedule {config.schedule or 'none'}; {config.workers} worker(s) at first; "
                 f"target {config.target_name}")
        if not self.told_clock:  # what the times are, said once per story
            self.say(f"  {clock_legend(result.config.virtual_time)}")
            self.told_clock = True
        for text in narrate(result.history, steps):
            self.say(f"  {text}")
        self.say(f"  {verdict_line(result)}")
        return result

    def expect(self, held: object, expected: str, found: str = "") -> bool:
        """Record a fact the story must show; returns whether it held."""
        self.checks.append(Check(expected, bool(held), found, len(self.results)))
        return bool(held)

    def conclude(self, text: str) -> None:
        """Close the story with its moral, but only if every fact held; otherwise say so."""
        self.say()
        failed = [c for c in self.checks if not c.held]
        if failed:
            self.say(f"=> the story did not happen as told: {len(failed)} expected fact(s) missing "
                     f"(see the checks below)")
        else:
            self.say(f"=> {text}")

    @property
    def held(self) -> bool:
        return all(c.held for c in self.checks)

    @property
    def verdict(self) -> bool | None:
        """The runs' verdict (false > unknown > true), made false by any fact that did not hold --
        unless a run could not tell the story at all (its target raised, or no invariant judged
        anything): the facts it misses say nothing of the rule, and the story is unknown."""
        runs = rank(r.valid for r in self.results) if self.results else None
        if runs is False:
            return False
        if not self.held:
            return None if any(_untold(r) for r in self.results) else False
        return runs


def _untold(result: RunResult) -> bool:
    """Whether a run was unknown because it could not run the story: the target raised, or no
    invariant judged anything (a target that is not a worker, or the infrastructure broke)."""
    if result.valid is not None:
        return False
    judged = sum(res.judged for res in result.verdict.results)
    return judged == 0 or bool(result.history.of(kind=vocab.RAISED)) or result.infrastructure is not None


# -- building runs -------------------------------------------------------------------------------


def config(target: Any, seed: int, store: str, schedule: str = "", *,
           points: Iterable[str] = (), wraps: Any = None, **fields: Any) -> RunConfig:
    """A run configuration for a scenario; a ``mutant:NAME`` target brings the run fields and the
    downstream overrides it needs. ``wraps`` is the target a scenario built ``target`` around
    (a mutant's needs come from its name). ``points`` are crash points the scenario adds."""
    from killpoint.harness.mutants import downstream_for, overrides_for

    name = wraps if wraps is not None else target
    known = chaos.POINTS | frozenset(points)
    values: dict[str, Any] = {**fields, **overrides_for(name)}
    values["downstream_overrides"] = {**downstream_for(name), **values.get("downstream_overrides", {})}
    return RunConfig(schedule=chaos.parse(schedule, points=known), target=target, seed=seed,
                     store=store, **values)


def worker_class(target: Any) -> type[ReferenceWorker] | None:
    """The ReferenceWorker class a target runs, so a scenario can add a behaviour to it.

    Known for ``reference`` and the built-in mutants (each runs one subclass, the ``cls`` its
    runner closes over); None for any other target, which a scenario then runs as it is.
    """
    from killpoint.harness.targets import resolve
    from killpoint.harness.worker import reference

    fn = resolve(target)
    if fn is reference:
        return ReferenceWorker
    cls = inspect.getclosurevars(fn).nonlocals.get("cls") if inspect.isfunction(fn) else None
    return cls if isinstance(cls, type) and issubclass(cls, ReferenceWorker) else None


# -- reading events ------------------------------------------------------------------------------


def typed(events: Iterable[Event], family: type[_F]) -> list[_F]:
    """The typed forms of the events a history's question gave (``store_events``: StoreEvent,
    ``requests`` and ``applied``: Request, ``worker_events(POINT)``: PointHit...), in order; as in
    ``History.typed``, an event of another family or not in the vocabulary is left out."""
    out: list[_F] = []
    for e in events:
        try:
            t = e.typed
        except InvalidEvent:
            continue  # in the history's invalid events: its verdict says so
        if isinstance(t, family):
            out.append(t)
    return out


def who(events: Iterable[Event | TypedEvent], *fields: str) -> str:
    """A short listing of events, as written or typed, for a check's "found" text."""
    out = []
    for e in events:
        values = [(f, _field(e, f)) for f in fields]
        parts = [f"{f}={x}" for f, x in values if x is not None]
        out.append(f"{e.kind}({', '.join(parts)})" if parts else e.kind)
    return "; ".join(out) or "nothing"


def _field(e: Event | TypedEvent, name: str) -> Any:
    """One field of an event by name (None when it has none): a typed event's field, or what its
    family does not name (its ``extra``), as the event was written."""
    if isinstance(e, Event):
        return e.get(name)
    value = getattr(e, name, None)
    return e.extra.get(name) if value is None else value


__all__ = ["Check", "Story", "WORD", "config", "typed", "who", "worker_class"]
