"""Turning the report model into self-contained HTML files.

One Jinja2 environment with autoescape on for every template, so a string from a run can only ever
land in a page as text (pytest-html once rendered test ids raw: its issue #1024). Data embedded for
tools goes through ``tojson``, which escapes ``<``, ``>``, ``&`` and ``'``. Pages carry a
Content-Security-Policy that allows nothing at all to load or run, and have no executable script:
the only ``<script>`` is an inert ``application/json`` data block, and the index filters with CSS
``:target``. So a report opens offline, from a CI artefact, and stays inert.

The timeline is laid out by :mod:`killpoint.reports.layout`.
"""

from __future__ import annotations

import functools

import jinja2

from killpoint.reports.base import clip
from killpoint.reports.index import IndexReport
from killpoint.reports.layout import GLYPHS, GUTTER, HEAD_H, LEASE_X, MAX_GAP, PX_PER_MS, ROW_H, layout
from killpoint.reports.model import RunReport

CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The one environment: autoescape for every template, and a loud error on a missing name.

    Made once per process and kept, so that each template is compiled once: a new environment per
    page compiled the three templates again for every page, most of a report's cost (about 1.1 s of
    a 1.3 s page, profiled, in a 68-page matrix)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("killpoint.reports", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["clip"] = clip
    env.globals.update(CSP=CSP, GLYPHS=GLYPHS, ROW_H=ROW_H, GUTTER=GUTTER, HEAD_H=HEAD_H,
                       MAX_GAP=MAX_GAP, BREAK_MS=f"{MAX_GAP / PX_PER_MS:g}",
                       LEASE_X=LEASE_X)
    return env


def render_run(report: RunReport, *, back: str | None = None) -> str:
    return environment().get_template("run.html").render(
        r=report, layout=layout(report.timeline), back=back, data=report.to_json())


def render_index(index: IndexReport) -> str:
    return environment().get_template("index.html").render(ix=index, data=index.to_json())


