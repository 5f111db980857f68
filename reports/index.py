"""The index over many runs, as data: their rows (violated first), the filters by violated
invariant, and the invariants' counts over the runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from killpoint.harness.checkers.base import rank
from killpoint.harness.redact import redact
from killpoint.reports.base import link, verdict_word
from killpoint.reports.model import EventRef, ViolationView

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult


@dataclass(frozen=True)
class IndexRow:
    position: int  # 1-based, the order the runs were made in
    run_id: str
    verdict: str
    schedule: str
    target: str
    seed: int
    href: str | None  # relative link to the run report; None: no page was written for it (the index only)
    violated: tuple[str, ...]  # invariant names
    slots: tuple[int, ...]  # filter slots of those invariants
    violations: tuple[ViolationView, ...]
    unknown_reasons: tuple[str, ...]
    duration_ms: float
    reproduce: str
    test: str | None = None  # the pytest node id of the test that made the run


@dataclass(frozen=True)
class Filter:
    """A filter of the index by violated invariant; ``slot`` is a small number used as its CSS id,
    so no run-controlled text ever lands in a selector."""

    invariant: str
    slot: int
    runs: int


@dataclass(frozen=True)
class IndexReport:
    title: str
    verdict: str
    rows: tuple[IndexRow, ...]  # violated first, then unknown, then valid
    filters: tuple[Filter, ...]
    invariants: tuple[tuple[str, int, int, int], ...]  # name, runs checked, violated, not applicable
    counts: tuple[tuple[str, int], ...]  # verdict word, runs
    exercise: str = ""  # what the runs' faults provoked, in a line (harness.exercise)
    # Why the runs together are unknown whatever each one's verdict (no pause exercised a takeover...)
    whole_reasons: tuple[str, ...] = ()

    @property
    def has_tests(self) -> bool:
        return any(r.test for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "valid": {"valid": True, "violated": False}.get(self.verdict),
                "exercise": self.exercise, "unknown_reasons": list(self.whole_reasons),
                "runs": [{"run_id": r.run_id, "verdict": r.verdict, "schedule": r.schedule,
                          "href": r.href, "violated": list(r.violated), "reproduce": r.reproduce,
                          "test": r.test}
                         for r in self.rows]}


_ORDER = {"violated": 0, "unknown": 1, "valid": 2}


def build_index(results: Sequence[RunResult], hrefs: Sequence[str | None], *, title: str,
                reproduce: Sequence[str] | None = None,
                tests: Sequence[str | None] | None = None) -> IndexReport:
    """The model of the index over many runs; ``hrefs[i]`` links to the report of ``results[i]``
    (None: no page was written for it), ``tests[i]`` (optional) names the test that made it."""
    if len(hrefs) != len(results):
        raise ValueError(f"{len(results)} results but {len(hrefs)} links: give one link per run")
    if tests is not None and len(tests) != len(results):
        raise ValueError(f"{len(results)} results but {len(tests)} test names: give one per run")
    names_of = list(tests) if tests is not None else [None] * len(results)
    if reproduce is None:
        reproduce = [r.config.reproduce_command() for r in results]
    reproduce = [redact(cmd) for cmd in reproduce]
    names: list[str] = []
    checked: dict[str, int] = {}
    violated_runs: dict[str, int] = {}
    na_runs: dict[str, int] = {}
    for r in results:
        for res in r.verdict.results:
            if res.invariant not in checked:
                names.append(res.invariant)
                checked[res.invariant] = violated_runs[res.invariant] = na_runs[res.invariant] = 0
            checked[res.invariant] += bool(res.checked) and res.applicable
            violated_runs[res.invariant] += res.valid is False
            na_runs[res.invariant] += not res.applicable
    filters = tuple(Filter(n, slot, violated_runs[n])
                    for slot, n in enumerate([n for n in names if violated_runs[n]], start=1))
    slot_of = {f.invariant: f.slot for f in filters}
    rows = []
    for pos, (r, href, cmd, test) in enumerate(zip(results, hrefs, reproduce, names_of), start=1):
        bad = tuple(dict.fromkeys(res.invariant for res in r.verdict.results if res.valid is False))
        schedule = str(r.config.schedule)
        views = tuple(ViolationView(v.invariant, v.instance, v.step, v.detail,
                                    tuple(EventRef(i, link(i), f"e{i}") for i in v.events),
                                    v.schedule or schedule, cmd) for v in r.verdict.violations)
        rows.append(IndexRow(pos, r.run_id, verdict_word(r.verdict.valid), schedule, r.config.target_name,
                             r.config.seed, href, bad, tuple(slot_of[b] for b in bad if b in slot_of),
                             views, tuple(str(u) for u in r.verdict.unknown_reasons),
                             round(r.duration_s * 1000, 1), cmd, test))
    rows.sort(key=lambda row: (_ORDER[row.verdict], row.position))
    counts = tuple((w, sum(1 for row in rows if row.verdict == w)) for w in ("violated", "unknown", "valid"))
    from killpoint.harness.exercise import matrix_reasons, total

    tally = total(r.exercise for r in results)
    whole = matrix_reasons(tally)
    valid = rank(r.verdict.valid for r in results) if results else None
    overall = verdict_word(None if valid is True and whole else valid)
    return IndexReport(title, overall, tuple(rows), filters,
                       tuple((n, checked[n], violated_runs[n], na_runs[n]) for n in names), counts,
                       tally.line(), whole)
