"""Turning the report model into HTML pages, and the data their shared script draws.

A directory of reports holds its pages and two shared files written once, ``killpoint.css`` and
``killpoint.js``, that every page links by a relative name: the folder stays self-contained and
opens from disk, offline. A run's page carries its banner, violations and invariants as HTML, and
its timeline (laid out here, by :mod:`killpoint.reports.layout`), event table and ledger as compact
data in an inert ``application/json`` block that the script draws; the bulk of a page is data
written once, not markup repeated per row.

One Jinja2 environment with autoescape on for every template, so a string from a run can only ever
land in a page as text (pytest-html once rendered test ids raw: its issue #1024). Embedded data is
JSON with ``<``, ``>``, ``&`` and ``'`` escaped, so it cannot end its block; the script sets every
string from it as text or as an attribute value, never as markup, and builds links and ids from
numbers. Pages carry a Content-Security-Policy that lets them load nothing but the folder's own
stylesheet and script and run no inline script. The index filters with CSS ``:target`` and runs
no script at all.
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup

from killpoint.reports.base import STATUSES, clip
from killpoint.reports.index import IndexReport
from killpoint.reports.layout import MAX_GAP, PX_PER_MS, Layout, layout
from killpoint.reports.model import LedgerRow, RunReport

# The folder's own stylesheet and script may load; nothing else may, and no inline script runs. Inline
# styles stay allowed for the index's filters (a rule per violated invariant).
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'")
ASSETS = ("killpoint.css", "killpoint.js")  # written once into a report directory, linked by every page
_STATUS = {word: n for n, word in enumerate(STATUSES)}
_SPAN, _INDETERMINATE, _PROOF = 1, 2, 4  # a timeline mark's flags
_ROW_PROOF, _ROW_DRAWN = 1, 2  # an event row's flags


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The one environment: autoescape for every template, and a loud error on a missing name.

    Made once per process and kept, so that each template is compiled once: a new environment per
    page compiled the three templates again for every page, most of a report's cost (about 1.1 s of
    a 1.3 s page, profiled, in a 68-page matrix)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("killpoint.reports", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["clip"] = clip
    env.globals.update(CSP=CSP, MAX_GAP=MAX_GAP, BREAK_MS=f"{MAX_GAP / PX_PER_MS:g}")
    return env


@functools.lru_cache(maxsize=None)
def asset(name: str) -> str:
    """The text of a shared file (:data:`ASSETS`), as the package ships it."""
    return resources.files("killpoint.reports").joinpath("templates", name).read_text(encoding="utf-8")


def inert_json(data: Any) -> Markup:
    """JSON for a ``<script type="application/json">`` block: compact, and with ``<``, ``>``, ``&``
    and ``'`` escaped so that no string in it can end the block or be read as markup."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
                  .replace("'", "\\u0027"))


def render_run(report: RunReport, *, back: str | None = None) -> str:
    return environment().get_template("run.html").render(
        r=report, back=back, data=inert_json(report.to_json()), view=packed(view(report, layout(report.timeline))))


def packed(data: Any) -> Markup:
    """Data for the page's script, as gzip-compressed compact JSON in base64 (a third of its size
    as plain JSON: a page's timeline and tables are most of it). Base64 is inert in any context."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return Markup(base64.b64encode(gzip.compress(text.encode("utf-8"), compresslevel=6, mtime=0)).decode("ascii"))


def unpacked(text: str) -> Any:
    """The data :func:`packed` wrote (for tests and tools that read a page's view)."""
    return json.loads(gzip.decompress(base64.b64decode(text)).decode("utf-8"))


def render_index(index: IndexReport) -> str:
    return environment().get_template("index.html").render(ix=index, data=inert_json(index.to_json()))


class _Words:
    """A page's table of repeated short strings (processes, kinds, instances...), named by number;
    each clipped to ``limit`` characters once, as it enters the table."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self._number: dict[tuple[str, int], int] = {}

    def __call__(self, word: str, limit: int) -> int:
        n = self._number.get((word, limit))
        if n is None:
            n = self._number[(word, limit)] = len(self.words)
            self.words.append(clip(word, limit))
        return n


def view(report: RunReport, drawn: Layout) -> dict[str, Any]:
    """What ``killpoint.js`` draws on a run's page, as compact lists (their order is the script's):
    the timeline as :func:`killpoint.reports.layout.layout` placed it, the event table and the
    ledger. Strings are clipped here, as the template clipped them."""
    word = _Words()
    timeline = {
        "w": drawn.width, "h": drawn.height, "lw": drawn.lane_w, "cut": drawn.cut,
        "lanes": [[b.x, b.head, _lane_title(b.lane.name, b.lane.pid, b.lane.ended), b.life_y, b.life_h,
                   int(bool(b.lane.ended) and b.lane.ended != "exit 0")] for b in drawn.lanes],
        "rows": [list(row) for row in drawn.rows],
        "breaks": [list(b) for b in drawn.breaks],
        "marks": [_mark(m.item.index, m.x, m.y, m.h, m.item.status,
                        (_SPAN if m.item.span else 0) | (_INDETERMINATE if m.item.indeterminate else 0)
                        | (_PROOF if m.item.proof else 0), m.text, m.title) for m in drawn.marks],
        "leases": [[b.lease.index, b.x, b.y, b.held_h, b.out_h, b.expiry_y, str(b.lease.fence),
                    clip(b.lease.label, 2000)] for b in drawn.leases],
        "opens": "the first event a violation names" if report.violations else "the first fault that fired",
        "gap_ms": f"{MAX_GAP / PX_PER_MS:g}", "gap_px": MAX_GAP,
    }
    invariants = [[clip(i.name, 200), i.status, ("yes" if i.checked else "no") if i.applicable else "n/a",
                   i.violations, clip(i.detail, 500)] for i in report.invariants]
    events = [[e.index, e.time_ms, word(e.process, 40), word(e.kind, 40), word(e.type, 20), _STATUS.get(e.status, 3),
               word(e.instance, 60), word(e.step, 60), e.detail,
               (_ROW_PROOF if e.proof else 0) | (_ROW_DRAWN if e.in_timeline else 0)] for e in report.events]
    return {"timeline": timeline, "invariants": invariants, "words": word.words, "events": events,
            "ledger": [_ledger(row) for row in report.ledger]}


def _mark(index: int, x: int, y: int, h: int, status: str, flags: int, text: str, title: str) -> list[Any]:
    mark: list[Any] = [index, x, y, h, _STATUS.get(status, 3), flags, text]
    if title:
        mark.append(title)
    return mark


def _lane_title(name: str, pid: int | None, ended: str) -> str:
    return clip(name, 500) + (f" \u00b7 pid {pid}" if pid else "") + (f" \u00b7 {clip(ended, 40)}" if ended else "")


def _cell(value: Any, limit: int = 40) -> Any:
    """A ledger value as shown: a number as it is, anything else as clipped text, nothing for null."""
    if value is None:
        return ""
    if type(value) is int:
        return value
    return clip(str(value), limit)


def _ledger(row: LedgerRow) -> list[Any]:
    key = clip(row.key, 120) if row.key is not None else "(no key) " + clip(row.scope, 120)
    return [row.index, _cell(row.seq), key, clip(row.resource, 60), clip(row.intent_hash, 70), _cell(row.fence),
            _cell(row.worker), _cell(row.attempt), _cell(row.http_status), clip(row.outcome, 40),
            int(bool(row.applied)), _STATUS.get(row.status, 3)]
