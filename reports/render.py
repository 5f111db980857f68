"""Turning the report model into self-contained HTML files.

One Jinja2 environment with autoescape on for every template, so a string from a run can only ever
land in a page as text (pytest-html once rendered test ids raw: its issue #1024). Data embedded for
tools goes through ``tojson``, which escapes ``<``, ``>``, ``&`` and ``'``. Pages carry a
Content-Security-Policy that allows nothing at all to load or run, and have no executable script:
the only ``<script>`` is an inert ``application/json`` data block, and the index filters with CSS
``:target``. So a report opens offline, from a CI artefact, and stays inert.

The timeline is laid out here, not in the model: rows are the distinct times of the drawn items, in
order (as in Jepsen's timeline), so a burst of microsecond-apart operations stays readable next to a
lease that waited a second.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import jinja2

from killpoint.reports.model import IndexReport, Item, Lane, RunReport, Timeline, clip

CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
GLYPHS = {"ok": "\u2713", "fail": "\u2717", "info": "?", "event": ""}  # shape and colour tell too

ROW_H = 16
LANE_W = 300
GUTTER = 78  # the time column
HEAD_H = 24
LABEL_CHARS = 42


@dataclass(frozen=True)
class Mark:
    """Where and how one timeline item is drawn."""

    item: Item
    x: int
    y: int
    h: int
    text_x: int
    text: str
    glyph: str
    title: str


@dataclass(frozen=True)
class LaneBox:
    lane: Lane
    x: int
    life_y: int | None  # the span of a worker incarnation's life, if known
    life_h: int


@dataclass(frozen=True)
class Layout:
    width: int
    height: int
    lanes: tuple[LaneBox, ...]
    marks: tuple[Mark, ...]
    rows: tuple[tuple[int, str], ...]  # y, time label


def layout(t: Timeline) -> Layout:
    times = sorted({i.start for i in t.items} | {i.end for i in t.items})
    row = {time: n for n, time in enumerate(times)}
    height = max(1, len(times)) * ROW_H + 8

    def y_of(time: int) -> int:
        # a lane's spawn or exit falls on the row of the nearest drawn time at or after it
        n = row.get(time)
        if n is None:
            n = next((k for k, tm in enumerate(times) if tm >= time), len(times))
        return 4 + n * ROW_H

    lane_x = {lane.name: GUTTER + k * LANE_W for k, lane in enumerate(t.lanes)}
    boxes = []
    for lane in t.lanes:
        if lane.kind == "worker":
            top = y_of(lane.start) if lane.start is not None else 4
            bottom = (y_of(lane.end) + ROW_H) if lane.end is not None else height - 4
            boxes.append(LaneBox(lane, lane_x[lane.name], top, max(ROW_H, bottom - top)))
        else:
            boxes.append(LaneBox(lane, lane_x[lane.name], None, 0))
    marks = []
    for item in t.items:
        x = lane_x.get(item.lane, GUTTER)
        y = y_of(item.start)
        h = (y_of(item.end) - y + ROW_H) if item.span else ROW_H
        title = item.label + ("\n" + item.detail if item.detail else "")
        marks.append(Mark(item, x + 4, y + 1, h - 2, x + 16, clip(item.label, LABEL_CHARS),
                          GLYPHS.get(item.status, ""), clip(title, 800)))
    rows = tuple((4 + n * ROW_H, f"+{time / 1e6:.3f} ms") for n, time in enumerate(times))
    return Layout(GUTTER + LANE_W * len(t.lanes), height, tuple(boxes), tuple(marks), rows)


def environment() -> jinja2.Environment:
    """The one environment: autoescape for every template, and a loud error on a missing name."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("killpoint.reports", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["clip"] = clip
    env.globals.update(CSP=CSP, GLYPHS=GLYPHS, ROW_H=ROW_H, LANE_W=LANE_W, GUTTER=GUTTER,
                       HEAD_H=HEAD_H)
    return env


def render_run(report: RunReport, *, back: str | None = None) -> str:
    return environment().get_template("run.html").render(
        r=report, layout=layout(report.timeline), back=back, data=report.to_json())


def render_index(index: IndexReport) -> str:
    return environment().get_template("index.html").render(ix=index, data=index.to_json())


def write_text(path: str, text: str) -> str:
    """Write a whole file atomically, so a reader never opens half a report."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".report-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
