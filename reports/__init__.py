"""HTML reports of runs: one page per run and an index over many, in a self-contained folder.

A run report explains a verdict at a glance -- the verdict banner, each violation with the events
that prove it and a command that reproduces it, a swimlane timeline, the event table and the
downstream ledger. A report folder holds its pages and two shared files, ``killpoint.css`` and
``killpoint.js``, that every page links by a relative name; a page embeds its timeline and tables
as inert data that the shared script draws, and its verdict as JSON for tools. Nothing is loaded
from outside the folder, and every string that came from a run is escaped, so reports are safe to
open from any CI artefact, offline.

The pages render :mod:`reports.model` (and :mod:`reports.index`), a plain data model that tests can
read directly; :mod:`reports.folder` names and writes the files.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Sequence

from killpoint.reports.base import DEFAULT_MAX_EVENTS
from killpoint.reports.folder import (INDEX, PagesAsTheyCome, page_names, write_assets, write_index,
                                      write_page)
from killpoint.reports.index import build_index

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult


def write_run_report(result: RunResult, path: str, *, max_events: int = DEFAULT_MAX_EVENTS,
                     back: str | None = None, focus_table: bool = False) -> str:
    """Write the report of one :class:`harness.run.RunResult` to ``path``, and the shared files
    beside it; returns ``path``.

    ``back`` is an optional relative link to an index page. With ``focus_table`` the event table
    keeps only the events of the instances the violations (else the faults) are about, and the
    harness's: one of many reports in a directory stays small and says how to get all of them.
    """
    write_assets(os.path.dirname(os.path.abspath(path)))
    return write_page(result, path, max_events=max_events, back=back, focus_table=focus_table)


def write_reports(results: Sequence[RunResult], report_dir: str, *, title: str,
                  max_events: int = DEFAULT_MAX_EVENTS, tests: Sequence[str | None] | None = None,
                  pages: bool = True, on_page: Callable[[int, int], None] | None = None) -> str:
    """Write one report per run and an index over them into ``report_dir``; returns the index path.

    Each page is named after its run (:func:`page_names`). A single run's report shows every event;
    among many, each report's event table follows the run's focus (see :func:`write_run_report`).
    ``tests`` names the test that made each run (a pytest node id), for the index. With ``pages``
    false only the index is written (its rows link no page: the runs' histories may be gone).
    ``on_page(done, total)`` is called after each page, for progress.
    """
    os.makedirs(report_dir, exist_ok=True)
    write_assets(report_dir)
    hrefs: list[str | None] = list(page_names([r.run_id for r in results])) if pages else [None] * len(results)
    for n, (result, href) in enumerate(zip(results, hrefs), start=1):
        if href is None:
            continue
        write_page(result, os.path.join(report_dir, href), max_events=max_events, back=INDEX,
                   focus_table=len(results) > 1)
        if on_page is not None:
            on_page(n, len(results))
    return write_index(build_index(list(results), hrefs, title=title, tests=tests), report_dir)


__all__ = ["PagesAsTheyCome", "page_names", "write_assets", "write_index", "write_reports", "write_run_report"]
