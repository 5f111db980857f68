"""HTML reports of runs: one page per run and an index over many, in a self-contained folder.

A run report explains a verdict at a glance -- the verdict banner, each violation with the events
that prove it and a command that reproduces it, a swimlane timeline, the event table and the
downstream ledger. A report folder holds its pages and two shared files, ``killpoint.css`` and
``killpoint.js``, that every page links by a relative name; a page embeds its timeline and tables
as inert JSON that the shared script draws, and its verdict as JSON for tools. Nothing is loaded
from outside the folder, and every string that came from a run is escaped, so reports are safe to
open from any CI artefact, offline.

The pages render :mod:`reports.model` (and :mod:`reports.index`), a plain data model that tests can
read directly.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Callable, Sequence

from killpoint.reports.base import DEFAULT_MAX_EVENTS
from killpoint.reports.files import write_text
from killpoint.reports.index import IndexReport, build_index
from killpoint.reports.model import build_run
from killpoint.reports.render import ASSETS, asset, render_index, render_run

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult

INDEX = "index.html"
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def page_names(run_ids: Sequence[str]) -> list[str]:
    """The file name of each run's report inside a report directory: its run id, ``run0023-s0-
    1a2b3c4d.html``, so that the index, the JSON and the folder name a run alike. A run id that is
    no plain file name, or that an earlier run already took, gets ``run-NNNN.html`` by position."""
    names: list[str] = []
    taken: set[str] = {INDEX}
    for position, run_id in enumerate(run_ids, start=1):
        name = f"{run_id}.html" if _FILE_NAME.fullmatch(run_id) else f"run-{position:04d}.html"
        while name in taken:
            name = name[: -len(".html")] + f"-{position}.html"
        taken.add(name)
        names.append(name)
    return names


def write_assets(report_dir: str) -> None:
    """Write the shared stylesheet and script into ``report_dir``, unless they are there already as
    this version of killpoint writes them."""
    for name in ASSETS:
        path = os.path.join(report_dir, name)
        text = asset(name)
        try:
            with open(path, encoding="utf-8") as fh:
                if fh.read() == text:
                    continue
        except (OSError, UnicodeDecodeError):
            pass
        write_text(path, text)


def write_run_report(result: RunResult, path: str, *, max_events: int = DEFAULT_MAX_EVENTS,
                     back: str | None = None, focus_table: bool = False) -> str:
    """Write the report of one :class:`harness.run.RunResult` to ``path``, and the shared files
    beside it; returns ``path``.

    ``back`` is an optional relative link to an index page. With ``focus_table`` the event table
    keeps only the events of the instances the violations (else the faults) are about, and the
    harness's: one of many reports in a directory stays small and says how to get all of them.
    """
    write_assets(os.path.dirname(os.path.abspath(path)))
    return _write_page(result, path, max_events=max_events, back=back, focus_table=focus_table)


def _write_page(result: RunResult, path: str, *, max_events: int, back: str | None, focus_table: bool) -> str:
    report = build_run(result, max_events=max_events, focus_table=focus_table)
    return write_text(path, render_run(report, back=back))


def write_index(index: IndexReport, report_dir: str) -> str:
    """Write the index page (and the shared files) into ``report_dir``; returns its path."""
    os.makedirs(report_dir, exist_ok=True)
    write_assets(report_dir)
    return write_text(os.path.join(report_dir, INDEX), render_index(index))


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
        _write_page(result, os.path.join(report_dir, href), max_events=max_events, back=INDEX,
                    focus_table=len(results) > 1)
        if on_page is not None:
            on_page(n, len(results))
    return write_index(build_index(list(results), hrefs, title=title, tests=tests), report_dir)


__all__ = ["page_names", "write_assets", "write_index", "write_reports", "write_run_report"]
