"""Schedules: which worker does what at which crash point of which step.

Text form, which round-trips through :func:`parse` and ``str``::

    A@charge.after_call:kill,B@charge.before_commit#2:pause

``worker@[step.]point[#hit]:actions``. Without a step the fault applies at any step; ``#hit`` makes
the action chain start at that hit of the point (earlier hits do nothing). A pause may say when
its worker comes back: ``A@charge.after_call:1*pause(until=after_claim)`` resumes A when another
worker has claimed the step (and holds that worker there while A goes on); the moment is one of
the crash points the schedule may name, or ``lapse``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from killpoint.chaos.actions import LAPSE, Chain, parse as parse_chain
from killpoint.chaos.points import POINTS
from killpoint.errors import InvalidAction as InvalidAction, InvalidSchedule as InvalidSchedule, shown


@dataclass(frozen=True)
class Fault:
    worker: str
    point: str
    actions: Chain
    step: str | None = None
    hit: int = 1

    def __str__(self) -> str:
        where = f"{self.step}.{self.point}" if self.step else self.point
        hit = f"#{self.hit}" if self.hit != 1 else ""
        return f"{self.worker}@{where}{hit}:{self.actions}"

    def matches(self, point: str, step: str | None) -> bool:
        return point == self.point and (self.step is None or self.step == step)


@dataclass(frozen=True)
class Schedule:
    faults: tuple[Fault, ...] = ()

    def __str__(self) -> str:
        return ",".join(str(f) for f in self.faults)

    def __bool__(self) -> bool:
        return bool(self.faults)

    def for_worker(self, worker: str) -> tuple[tuple[int, Fault], ...]:
        return tuple((i, f) for i, f in enumerate(self.faults) if f.worker == worker)

    @property
    def moments(self) -> frozenset[str]:
        """Every resume moment its pauses name: the points whose hits workers report to the harness."""
        return frozenset(m for f in self.faults for m in f.actions.moments)

    @property
    def workers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.worker for f in self.faults))


_NAME = r"[A-Za-z][A-Za-z0-9_-]*"
_FAULT = re.compile(rf"^(?P<worker>{_NAME})@(?:(?P<step>{_NAME})\.)?(?P<point>{_NAME})"
                    rf"(?:#(?P<hit>[0-9]+))?:(?P<actions>.+)$")


def _split(text: str) -> list[str]:
    """Split on commas that are not inside parentheses (``sleep(10)`` has none, but be safe)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _parse_fault(text: str, *, points: frozenset[str] | None, named: bool) -> Fault:
    """One fault. ``named``: the messages say which fault the bad part is in; in a schedule of one
    fault that is the schedule, which whoever reports the error names already (a long bad value
    is then named once in the line, not twice or three times)."""
    part = text.strip()
    where = f" in {shown(part)}" if named else ""
    m = _FAULT.match(part)
    if not m:
        raise InvalidSchedule(f"cannot read fault {shown(part)}: expected WORKER@[STEP.]POINT[#HIT]:ACTIONS, "
                              f"as in A@charge.after_call:kill")
    known = POINTS if points is None else points
    if m["point"] not in known:
        raise InvalidSchedule(f"unknown crash point {shown(m['point'])}{where}: "
                              f"valid points are {', '.join(sorted(known))}")
    hit = int(m["hit"]) if m["hit"] else 1
    if hit < 1:
        raise InvalidSchedule(f"hit numbers start at 1{',' if named else ''}{where}")
    try:
        chain = parse_chain(m["actions"])
    except InvalidAction as exc:
        raise InvalidSchedule(f"in fault {shown(part)}: {exc}" if named else str(exc)) from None
    for moment in chain.moments:
        if moment != LAPSE and moment not in known:
            raise InvalidSchedule(f"unknown resume moment {shown(moment)}{where}: use a crash point "
                                  f"({', '.join(sorted(known))}) or {LAPSE}")
    return Fault(m["worker"], m["point"], chain, m["step"], hit)


def parse(text: str, *, points: frozenset[str] | None = None, context: bool = True) -> Schedule:
    """Parse a schedule; the empty string (or ``none``) is the schedule without faults.

    ``points`` is the set of crash-point names allowed (the built-in ones by default; a target may
    add its own). An error names the bad part and the fault it is in; ``context=False`` leaves the
    fault out when the schedule is that one fault, for a caller whose message names the schedule
    already (the command line: a long bad value is then named once in its line, not twice).
    """
    if text is None or not text.strip() or text.strip() == "none":
        return Schedule()
    parts = _split(text)
    faults = tuple(_parse_fault(p, points=points, named=context or len(parts) > 1) for p in parts)
    seen: dict[tuple[str, str | None, str, int], Fault] = {}
    for fault in faults:
        first = seen.setdefault((fault.worker, fault.step, fault.point, fault.hit), fault)
        if first is not fault:  # two faults competing for one hit: only the first could fire
            raise InvalidSchedule(f"{shown(str(fault))} is at the same worker, step, point and hit as "
                                  f"{shown(str(first))}, so only one of them could fire: give one of "
                                  f"them another hit (#2), or write one chain (1*pause->kill: pause at "
                                  f"this hit, kill at the next)")
    return Schedule(faults)
