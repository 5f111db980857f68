"""Per-process plugin state, its session-end hooks, and the terminal summary."""

from __future__ import annotations

import base64
import os
import pickle
from typing import TYPE_CHECKING, Any

import pytest

from killpoint._plugin.settings import Settings

if TYPE_CHECKING:
    from killpoint._plugin.fixture import Killpoint  # noqa: F401 - read by mypy in StashKey["Killpoint"]

INDEX = "index.html"


class _State:
    """Per-process plugin state and the session-end hooks, registered once per config.

    A plugin object rather than module globals: pytester can run several sessions in one process.
    """

    def __init__(self, settings: Settings, worker_id: str | None) -> None:
        self.settings = settings
        self.worker_id = worker_id  # the xdist worker id (gw0, ...); None on the controller or without xdist
        self.pages = 0  # run report pages this process wrote
        self.records: list[dict[str, Any]] = []  # every run of the session, for the summary and index
        self.index: str | None = None  # the HTML index, once written
        self.index_error: str | None = None
        self.failed: set[str] = set()  # node ids of tests that failed or errored

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect run records (on the controller they arrive from xdist workers in reports)."""
        self.records.extend(getattr(report, "killpoint_runs", None) or ())
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the HTML index over every run of the session: on the controller only, once.

        A session that wrote pages first removes those an earlier session or command left in the
        directory (as a command clears them as its first run starts): without it, an earlier
        session's pages that this one did not overwrite -- every gwN-run-NNNN.html of an xdist
        session, when the next one ran without xdist or with fewer runs -- stayed beside the new
        ones, reports of runs no index listed any more."""
        if self.worker_id is not None or self.settings.report_dir is None:
            return
        lights = sorted((r for r in self.records if r.get("light")), key=lambda r: (r["nodeid"], r["page"]))
        if not lights:
            return
        from killpoint.reports import write_index
        from killpoint.reports.index import build_index
        from killpoint.reports.files import clear_earlier_pages

        written = {os.path.basename(r["page"]) for r in self.records if r.get("page")}
        try:
            clear_earlier_pages(self.settings.report_dir, keep=written)
        except OSError:
            pass  # a page left behind never hides the session's own reports

        results = [pickle.loads(base64.b64decode(r["light"])) for r in lights]
        model = build_index(results, [os.path.basename(r["page"]) for r in lights],
                            title="killpoint: pytest session", reproduce=[r["reproduce"] for r in lights],
                            tests=[r["nodeid"] for r in lights])
        path = os.path.join(self.settings.report_dir, INDEX)
        try:
            self.index = write_index(model, self.settings.report_dir)
        except OSError as exc:  # a report never hides the verdicts: the summary says so, in one line
            self.index_error = (f"HTML report: index {path} not written: {exc.strerror or exc}; "
                                f"each test's own run pages stand")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from killpoint._plugin.interrupt import received_line

        if self.worker_id is not None:
            return
        if self.records:
            _summary(terminalreporter, self)
        line = received_line()
        if line is not None:  # a signal ended the session: said as the command line says it
            if not self.records:
                terminalreporter.write_sep("=", "killpoint")
            terminalreporter.write_line(line)


_STATE = pytest.StashKey[_State]()
_HANDLE = pytest.StashKey["Killpoint"]()  # the fixture object of an item, for the after-body check
_RUNS = pytest.StashKey[list]()  # records of the runs an item made


def _summary(tr: Any, state: _State) -> None:
    """The closing lines: runs, violations by invariant, the HTML index, the reproduce commands."""
    records = sorted(state.records, key=lambda r: r["nodeid"])
    runs = sum(r.get("count", 1) for r in records)
    counts = {word: sum(r.get("count", 1) for r in records if r["valid"] is value)
              for word, value in (("valid", True), ("violated", False), ("unknown", None))}
    tests = len({r["nodeid"] for r in records})
    shard = state.settings.shard
    tr.write_sep("=", "killpoint")
    tr.write_line(f"{runs} crash run{'s' if runs != 1 else ''} in {tests} test{'s' if tests != 1 else ''}: "
                  f"{counts['valid']} valid, {counts['violated']} violated, {counts['unknown']} unknown"
                  + (f" (shard {shard[0]}/{shard[1]})" if shard != (1, 1) else ""))
    by_invariant: dict[str, int] = {}
    for r in records:
        for name in r["violated"]:
            by_invariant[name] = by_invariant.get(name, 0) + 1
    if by_invariant:
        tr.write_line("violations by invariant (runs):")
        for name, n in sorted(by_invariant.items(), key=lambda kv: (-kv[1], kv[0])):
            tr.write_line(f"  {name:<24} {n}")
    if tr.config.option.verbose > 0:
        _point_stats(tr, records)
    if state.index:
        tr.write_line(f"HTML report: {state.index}")
    elif state.index_error:
        tr.write_line(state.index_error)
    elif counts["valid"] != runs and state.settings.report_dir is None:
        tr.write_line("HTML report: none (pass --killpoint-report-dir DIR to write one)")
    bad = [r for r in records if r["valid"] is not True and r["nodeid"] in state.failed]
    judged = sum(r.get("count", 1) for r in records if r["valid"] is not True and r["nodeid"] not in state.failed)
    if judged:
        tr.write_line(f"not valid, in tests that passed and so expected it: {judged} "
                      f"run{'s' if judged != 1 else ''}")
    if bad:
        tr.write_line("reproduce:")
        for r in bad[:20]:
            tr.write_line(f"  {r['nodeid']} ({', '.join(r['violated']) or 'unknown'}): {r['reproduce']}")
        if len(bad) > 20:
            tr.write_line(f"  ... and {len(bad) - 20} more")


def _point_stats(tr: Any, records: list[dict[str, Any]]) -> None:
    """With -v: the crash points that fired over the session's runs, by action and worker."""
    from collections import Counter

    from killpoint.harness.stats import PointStats

    stats = PointStats()
    for r in records:
        points = r.get("points")
        if points:
            stats = stats + PointStats(1, Counter(points["reached"]),
                                       Counter({(p, w, a): n for p, w, a, n in points["fired"]}))
    if not stats.runs:
        return
    tr.write_line(f"crash points over {stats.runs} run{'s' if stats.runs != 1 else ''}, "
                  f"{stats.total_fired} fired:")
    for line in stats.lines():
        tr.write_line(f"  {line}")
