"""Statistics of crash points: which points the workers reached, and which fired, how often, where.

Read from a run's history (every point hit is journaled, with the action that fired or ``None``),
so they count what happened, not what was scheduled. A worker is counted by its identity: ``A.2``,
worker A restarted, is A. Per run and summed over many runs, as Hypothesis's statistics are per
test: a point that was scheduled but never fired is plain to see.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from killpoint.harness.events import PointHit
from killpoint.harness.history import History


@dataclass
class PointStats:
    """Counts over one run or many. ``fired`` keys are (point, worker identity, action)."""

    runs: int = 0
    reached: Counter[str] = field(default_factory=Counter)  # point -> hits, fired or not
    fired: Counter[tuple[str, str, str]] = field(default_factory=Counter)

    @classmethod
    def of(cls, history: History) -> "PointStats":
        stats = cls(runs=1)
        for hit in history.typed(PointHit):
            stats.reached[hit.point] += 1
            if hit.action:
                stats.fired[(hit.point, hit.process.split(".")[0], hit.action)] += 1
        return stats

    def __add__(self, other: "PointStats") -> "PointStats":
        return PointStats(self.runs + other.runs, self.reached + other.reached, self.fired + other.fired)

    @property
    def total_fired(self) -> int:
        return sum(self.fired.values())

    def to_json(self) -> dict[str, Any]:
        """``{"runs", "fired_total", "reached": {point: n}, "fired": {point: {worker: {action: n}}}}``."""
        fired: dict[str, dict[str, dict[str, int]]] = {}
        for (point, worker, action), n in sorted(self.fired.items()):
            fired.setdefault(point, {}).setdefault(worker, {})[action] = n
        return {"runs": self.runs, "fired_total": self.total_fired,
                "reached": dict(sorted(self.reached.items())), "fired": fired}

    def lines(self) -> list[str]:
        """A table: each point that fired, by action, with the workers it fired on."""
        rows: dict[tuple[str, str], Counter[str]] = {}
        for (point, worker, action), n in self.fired.items():
            rows.setdefault((point, action), Counter())[worker] += n
        out = [f"{'point':<18} {'action':<10} {'fired':>6} {'reached':>8}  workers"]
        for (point, action), workers in sorted(rows.items()):
            by = ", ".join(f"{w} x{n}" for w, n in sorted(workers.items()))
            out.append(f"{point:<18} {action:<10} {sum(workers.values()):>6} {self.reached[point]:>8}  {by}")
        never = sorted(p for p in self.reached if not any(k[0] == p for k in self.fired))
        if never:
            out.append(f"reached, never fired: {', '.join(never)}")
        return out


def total(stats: Iterable[PointStats]) -> PointStats:
    out = PointStats()
    for s in stats:
        out = out + s
    return out


def brief(stats: PointStats) -> str:
    """One line: ``after_call A kill x1, heartbeat A hang x1`` (or ``no point fired``)."""
    parts = [f"{point} {worker} {action} x{n}" for (point, worker, action), n in sorted(stats.fired.items())]
    return ", ".join(parts) if parts else "no point fired"


__all__ = ["PointStats", "total", "brief"]
