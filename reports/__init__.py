"""Self-contained HTML reports of runs: one page per run and an index over many.

A run report explains a verdict at a glance -- the verdict banner, each violation with the events
that prove it and a command that reproduces it, a swimlane timeline, the event table and the
downstream ledger. Pages embed their CSS and SVG, load nothing, run no script (their verdict is
also embedded as inert JSON, for tools) and escape every string that came from a run, so they
are safe to open from any CI artefact, offline.

The pages render :mod:`reports.model`, a plain data model that tests can read directly.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Sequence

from killpoint.reports.base import DEFAULT_MAX_EVENTS
from killpoint.reports.index import build_index
from killpoint.reports.model import build_run
from killpoint.reports.files import write_text
from killpoint.reports.render import render_index, render_run

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult

INDEX = "index.html"


def run_report_name(position: int) -> str:
    """The file name of the ``position``-th (1-based) run's report inside a report directory.

    Named by position, not run id: run ids restart in every session, positions do not collide.
    """
    return f"run-{position:04d}.html"


def write_run_report(result: RunResult, path: str, *, max_events: int = DEFAULT_MAX_EVENTS,
                     back: str | None = None, focus_table: bool = False) -> str:
    """Write the report of one :class:`harness.run.RunResult` to ``path``; returns ``path``.

    ``back`` is an optional relative link to an index page. With ``focus_table`` the event table
    keeps only the events of the instances the violations (else the faults) are about, and the
    harness's: one of many reports in a directory stays small and says how to get all of them.
    """
    report = build_run(result, max_events=max_events, focus_table=focus_table)
    return write_text(path, render_run(report, back=back))


def write_reports(results: Sequence[RunResult], report_dir: str, *, title: str,
                  max_events: int = DEFAULT_MAX_EVENTS, tests: Sequence[str | None] | None = None,
                  pages: bool = True, on_page: Callable[[int, int], None] | None = None) -> str:
    """Write one report per run and an index over them into ``report_dir``; returns the index path.

    A single run's report shows every event; among many, each report's event table follows the
    run's focus (see :func:`write_run_report`). ``tests`` names the test that made each run (a
    pytest node id), for the index. With ``pages`` false only the index is written (its rows link
    no page: the runs' histories may be gone). ``on_page(done, total)`` is called after each page,
    for progress.
    """
    os.makedirs(report_dir, exist_ok=True)
    hrefs: list[str | None] = [run_report_name(n) if pages else None for n in range(1, len(results) + 1)]
    for n, (result, href) in enumerate(zip(results, hrefs), start=1):
        if href is None:
            continue
        write_run_report(result, os.path.join(report_dir, href), max_events=max_events, back=INDEX,
                         focus_table=len(results) > 1)
        if on_page is not None:
            on_page(n, len(results))
    index = build_index(list(results), hrefs, title=title, tests=tests)
    return write_text(os.path.join(report_dir, INDEX), render_index(index))


__all__ = ["write_reports", "write_run_report", "run_report_name"]
