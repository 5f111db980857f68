"""A report folder: its pages' names, its shared files, and its pages written as a command's runs come.

A folder holds ``index.html``, one page per run named after the run (:func:`page_names`), and
the two files every page links, ``killpoint.css`` and ``killpoint.js`` (:func:`write_assets`).
:class:`PagesAsTheyCome` writes each run's page as soon as it is known to be wanted, so that a
matrix need not keep every run's history until its end: 122 kept histories grew the command's
process from 38 to 102 MiB, and every worker forked from it paid for that in page tables and
copy-on-write faults (about 8% of the runs' CPU, measured).
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


class _Names:
    """Page names handed out in run order: a run's id, else ``run-NNNN`` by its position, never
    one twice."""

    def __init__(self) -> None:
        self.taken: set[str] = {INDEX}

    def next(self, run_id: str, position: int) -> str:
        name = f"{run_id}.html" if _FILE_NAME.fullmatch(run_id) else f"run-{position:04d}.html"
        while name in self.taken:
            name = name[: -len(".html")] + f"-{position}.html"
        self.taken.add(name)
        return name


def page_names(run_ids: Sequence[str]) -> list[str]:
    """The file name of each run's report inside a report directory: its run id, ``run0023-s0-
    1a2b3c4d.html``, so that the index, the JSON and the folder name a run alike. A run id that is
    no plain file name, or that an earlier run already took, gets ``run-NNNN.html`` by position."""
    names = _Names()
    return [names.next(run_id, n) for n, run_id in enumerate(run_ids, start=1)]


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


def write_page(result: RunResult, path: str, *, max_events: int = DEFAULT_MAX_EVENTS, back: str | None = None,
               focus_table: bool = False) -> str:
    """Write one run's page to ``path`` (the shared files must be beside it); returns ``path``."""
    report = build_run(result, max_events=max_events, focus_table=focus_table)
    return write_text(path, render_run(report, back=back))


def write_index(index: IndexReport, report_dir: str) -> str:
    """Write the index page (and the shared files) into ``report_dir``; returns its path."""
    os.makedirs(report_dir, exist_ok=True)
    write_assets(report_dir)
    return write_text(os.path.join(report_dir, INDEX), render_index(index))


class PagesAsTheyCome:
    """The pages of a command's runs, each written as soon as it is known to be wanted.

    With ``always`` every run's page is wanted, and written as its run is :meth:`add`-ed. Else
    pages are wanted once some run is not valid (``--report on-failure``): until then each run is
    held, its events with it, and the first run that is not valid has every held page written.
    :meth:`finish` writes what is still held when pages are wanted after all (the runs together
    can be unknown though each is valid), and the index. A page that cannot be written stops the
    writing: the error is raised by :meth:`finish`, after the runs, never in the middle of them.
    """

    def __init__(self, report_dir: str, *, title: str, always: bool, many: bool = True) -> None:
        self.dir, self.title, self.wanted, self.many = report_dir, title, always, many
        self.hrefs: list[str | None] = []  # by position: the page written for each run added
        self.held: list[tuple[int, RunResult]] = []  # runs whose page is not known to be wanted yet
        self.written = 0
        self.error: OSError | None = None
        self._names = _Names()
        self._assets = False

    def add(self, result: RunResult) -> None:
        """The next run, in the order the index lists them."""
        self.hrefs.append(None)
        position = len(self.hrefs)
        if not self.wanted and result.valid is not True:
            self.wanted = True
            for held in self.held:
                self._write(*held)
            self.held = []
        if self.wanted:
            self._write(position, result)
        else:
            self.held.append((position, result))

    def finish(self, results: Sequence[RunResult], *, pages: bool, tests: Sequence[str | None] | None = None,
               on_page: Callable[[int, int], None] | None = None) -> str:
        """Write the pages still held when ``pages`` wants them, then the index over ``results``
        (the runs added, in order); returns the index's path. ``on_page(done, total)`` follows the
        pages written here."""
        if len(results) != len(self.hrefs):
            raise ValueError(f"{len(results)} results but {len(self.hrefs)} runs added: add every run")
        held, self.held = self.held, []
        if pages:
            for n, (position, result) in enumerate(held, start=1):
                self._write(position, result)
                if on_page is not None:
                    on_page(n, len(held))
        if self.error is not None:
            raise self.error
        index = build_index(list(results), self.hrefs, title=self.title, tests=tests)
        return write_index(index, self.dir)

    def _write(self, position: int, result: RunResult) -> None:
        if self.error is not None:
            return
        name = self._names.next(result.run_id, position)
        try:
            if not self._assets:
                os.makedirs(self.dir, exist_ok=True)
                write_assets(self.dir)
                self._assets = True
            write_page(result, os.path.join(self.dir, name), back=INDEX, focus_table=self.many)
        except OSError as exc:
            self.error = exc
            return
        self.hrefs[position - 1] = name
        self.written += 1
