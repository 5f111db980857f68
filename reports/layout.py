"""Laying out the swimlane timeline: where each lane, mark and lease of a run is drawn.

Its vertical axis is elapsed time, compressed where nothing happens: each distinct time gets a row,
and a gap between two times adds height in proportion to its length (up to a cap, past which the
axis is broken and says how long the gap was), so a burst of microsecond-apart operations stays
readable next to a lease that ran out over a hundred milliseconds -- or, on the virtual clock, over
30 s of run time that cost no wall time. Times are the run's
(:func:`killpoint.harness.narrate.run_time`). The lanes share a fixed design width that fits a
1280-pixel window, and the drawing scales down (never sideways-scrolls) when a run has many workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from killpoint.harness.narrate import gap, run_time
from killpoint.reports.base import clip
from killpoint.reports.timeline import Item, Lane, Lease, Timeline

GLYPHS = {"ok": "\u2713", "fail": "\u2717", "info": "?", "event": ""}  # shape and colour tell too

ROW_H = 16
WIDTH = 1180  # the design width: fits the page at 1280 px
MIN_LANE_W = 120  # below this, the drawing is wider than WIDTH and scales down
GUTTER = 84  # the time column: "+1234.567 ms" fits
HEAD_H = 24
LABEL_CHARS = 60  # the most characters of a label drawn; the whole label is its tooltip
CHAR_W = 6.4  # width of one character of a label (10.5 px monospace)
HEAD_CHAR_W = 7.4  # and of a lane's heading (12 px, bold)
PX_PER_MS = 1.5  # height a gap adds, per millisecond
MAX_GAP = 150  # a longer gap is drawn this tall, with a break in the axis
FOLD_BELOW = 200  # a first proof further down than this opens the drawing just above it
LEASE_X = 2  # the lease bar, at the left edge of its holder's lane
MARK_X = 10  # operations and events, right of it


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
    title: str  # empty when the text already says it all


@dataclass(frozen=True)
class LeaseBar:
    """A lease in its holder's lane: held (solid) from ``y`` for ``held_h``, then running out
    (hatched) for ``out_h``; ``expiry_y`` marks when it ran out, if it did."""

    lease: Lease
    x: int
    y: int
    held_h: int
    out_h: int
    expiry_y: int | None


@dataclass(frozen=True)
class LaneBox:
    lane: Lane
    x: int
    life_y: int | None  # the span of a worker incarnation's life, if known
    life_h: int
    head: str = ""  # the lane's heading, cut to its width (the whole is its tooltip)


def heading(lane: Lane, lane_w: int) -> str:
    """``A · pid 123 · SIGKILL``, dropping what does not fit the lane's width, last first."""
    fits = max(4, int((lane_w - 10) / HEAD_CHAR_W))
    parts = [clip(lane.name, 14)]
    for extra in (f"pid {lane.pid}" if lane.pid else "", clip(lane.ended, 12)):
        if extra and len(" \u00b7 ".join(parts + [extra])) <= fits:
            parts.append(extra)
    return clip(" \u00b7 ".join(parts), fits)


@dataclass(frozen=True)
class Layout:
    width: int
    height: int
    lane_w: int
    lanes: tuple[LaneBox, ...]
    marks: tuple[Mark, ...]
    leases: tuple[LeaseBar, ...]
    rows: tuple[tuple[int, str], ...]  # y, elapsed time label
    breaks: tuple[tuple[int, str], ...]  # y, length of a gap drawn shorter than it was
    # Where the drawing is opened at: a few rows above the first mark a violation names (else the
    # first fault that fired), so that it is on the first screen; what is above is folded away.
    cut: int = 0

    def parts(self) -> tuple[tuple[int, int], ...]:
        """The vertical ranges drawn: (0, cut) folded, then (cut, height); one range without a cut."""
        return ((0, self.cut), (self.cut, self.height)) if self.cut else ((0, self.height),)


def time_axis(times: list[int]) -> tuple[dict[int, int], list[tuple[int, str]], int]:
    """The y of each distinct time (ns), the axis breaks, and the height of the drawing.

    A gap adds height in proportion to its length up to ``MAX_GAP``; a longer one (a lease or a
    stuck bound the virtual clock skipped, 30 s in no wall time) is drawn ``MAX_GAP`` tall and
    breaks the axis, labelled with the run time it stands for ("+30.0 s"). Every time keeps its
    own row, so the order of events is the same on both sides of a break.
    """
    y_of: dict[int, int] = {}
    breaks: list[tuple[int, str]] = []
    y = 4
    for n, time in enumerate(times):
        if n:
            gap_ns = time - times[n - 1]
            grow = gap_ns / 1e6 * PX_PER_MS
            if grow > MAX_GAP:
                breaks.append((y + ROW_H + MAX_GAP // 2 - ROW_H // 2, gap(gap_ns)))
            y += ROW_H + int(min(grow, MAX_GAP))
        y_of[time] = y
    return y_of, breaks, y + ROW_H + 4


def axis_label(time: int) -> str:
    """A row's run time on the axis: "+51.194 ms", or past 10 s "+30.047495 s" (it fits the gutter)."""
    return "+" + run_time(time, ms_places=3, s_places=6)


def layout(t: Timeline) -> Layout:
    # A lease's expiry is a time of its own: its mark sits on its row, on the right side of a break.
    times = sorted({i.start for i in t.items} | {i.end for i in t.items}
                   | {p for lease in t.leases for p in (lease.start, lease.held_until, lease.end)}
                   | {lease.expiry for lease in t.leases if lease.expiry is not None})
    at, breaks, height = time_axis(times)

    def y_of(time: int) -> int:
        # a lane's spawn or exit falls on the row of the nearest drawn time at or after it
        if time in at:
            return at[time]
        return next((at[tm] for tm in times if tm >= time), height - 4)

    n = max(1, len(t.lanes))
    lane_w = max(MIN_LANE_W, (WIDTH - GUTTER) // n)
    chars = max(8, min(LABEL_CHARS, int((lane_w - MARK_X - 14) / CHAR_W) - 2))  # 2: the glyph
    lane_x = {lane.name: GUTTER + k * lane_w for k, lane in enumerate(t.lanes)}
    boxes = []
    for lane in t.lanes:
        if lane.kind == "worker":
            top = y_of(lane.start) if lane.start is not None else 4
            bottom = (y_of(lane.end) + ROW_H) if lane.end is not None else height - 4
            boxes.append(LaneBox(lane, lane_x[lane.name], top, max(ROW_H, bottom - top),
                                 heading(lane, lane_w)))
        else:
            boxes.append(LaneBox(lane, lane_x[lane.name], None, 0, heading(lane, lane_w)))
    marks = []
    for item in t.items:
        x = lane_x.get(item.lane, GUTTER)
        y = y_of(item.start)
        h = (y_of(item.end) - y + ROW_H) if item.span else ROW_H
        text = clip(item.label, chars)
        title = "" if text == item.label else clip(item.label, 2000)
        marks.append(Mark(item, x + MARK_X, y + 1, h - 2, x + MARK_X + 12, text,
                          GLYPHS.get(item.status, ""), title))
    bars = []
    for lease in t.leases:
        if lease.lane not in lane_x:
            continue
        y0, y1, y2 = (y_of(time) + ROW_H // 2 for time in (lease.start, lease.held_until, lease.end))
        bars.append(LeaseBar(lease, lane_x[lease.lane] + LEASE_X, y0, max(2, y1 - y0), max(0, y2 - y1),
                             None if lease.expiry is None else y_of(lease.expiry) + ROW_H // 2))
    rows = tuple((y, axis_label(time)) for time, y in at.items())
    first = min((m.y for m in marks if m.item.proof), default=None)
    if first is None:
        first = min((m.y for m in marks if m.item.kind == "point"), default=None)
    cut = 0
    if first is not None and first > FOLD_BELOW:
        cut = max(y for y in at.values() if y <= first - 2 * ROW_H) if any(
            y <= first - 2 * ROW_H for y in at.values()) else 0
    return Layout(GUTTER + lane_w * n, height, lane_w, tuple(boxes), tuple(marks), tuple(bars), rows,
                  tuple(breaks), cut)
