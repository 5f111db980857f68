"""The data a run's report is made from: frozen values built from one run.

The HTML is only a rendering of these values, so tests judge what a report *says* -- which lanes,
which items, which violations -- without reading HTML, as Jepsen tests its timeline's element tree.
Nothing here escapes anything: the rendering does, because only it knows the context. Every string
in this model may come from a run (instance ids, worker ids, payloads, exception text) and must be
treated as hostile by whoever shows it.

The timeline's data is :mod:`killpoint.reports.timeline`'s, the index's
:mod:`killpoint.reports.index`'s. Every item and row names the event it comes from by its link id,
``e<index>``, which is the anchor of that event's row in the event table.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from killpoint import vocab
from killpoint.harness.events import PointHit, Request, WorkerOp
from killpoint.harness.history import Event, History
from killpoint.harness.narrate import about, clock_note, run_time, span
from killpoint.harness.redact import redact
from killpoint.reports.base import (DEFAULT_MAX_EVENTS, DETAIL_CHARS, OK_OUTCOMES, STATUSES, clip, describe, link,
                                    typed, verdict_word)
from killpoint.reports.timeline import Timeline, build_timeline, marking

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult


@dataclass(frozen=True)
class Banner:
    """The first thing a reader sees: the verdict and everything needed to run it again."""

    verdict: str  # valid | violated | unknown
    run_id: str
    schedule: str
    target: str
    seed: int
    workers: int
    workload: str
    store: str
    duration_ms: float
    spawned: int
    fired: tuple[tuple[str, int], ...]  # fault text, times fired
    unfired: tuple[str, ...]
    unknown_reasons: tuple[str, ...]
    violated: tuple[str, ...]  # names of the violated invariants, in checker order
    reproduce: str
    # The timeline's times are the run's: on the virtual clock they include the waits the harness
    # skipped (a 30 s lease in a 100 ms run); ``run_time`` is their span, as "30.0734 s".
    virtual: bool = False
    run_time: str = ""
    clock: str = ""  # what the times are, in words (narrate.clock_note)
    # What the faults provoked (harness.exercise): the run's counts in a line, and one line per fault.
    exercise: str = ""
    provoked: tuple[str, ...] = ()


@dataclass(frozen=True)
class InvariantRow:
    name: str
    checked: bool  # the history had something for this invariant to judge
    valid: bool | None
    violations: int
    detail: str
    applicable: bool = True  # False: the target owns its state and gave this invariant nothing

    @property
    def status(self) -> str:
        if not self.applicable:
            return "not applicable"
        if self.valid is True and not self.checked:
            return "not checked"
        return verdict_word(self.valid)


@dataclass(frozen=True)
class EventRef:
    """A link to an event that proves a violation, with a one-line description of it."""

    index: int
    link: str
    label: str


@dataclass(frozen=True)
class ViolationView:
    invariant: str
    instance: str | None
    step: str | None
    detail: str
    events: tuple[EventRef, ...]
    schedule: str
    reproduce: str


@dataclass(frozen=True)
class EventRow:
    index: int
    link: str
    time_ms: float
    process: str
    kind: str
    type: str
    status: str
    instance: str
    step: str
    detail: str
    proof: bool  # named by a violation
    in_timeline: bool


@dataclass(frozen=True)
class LedgerRow:
    """One request the downstream saw: the ground truth about effects."""

    index: int
    link: str
    seq: Any
    resource: str
    key: str | None  # None: a legacy resource without keys (then ``scope`` identifies the intent)
    scope: str
    intent_hash: str
    fence: Any
    worker: str
    attempt: Any
    http_status: Any
    outcome: str
    applied: bool
    status: str


@dataclass(frozen=True)
class RunReport:
    banner: Banner
    invariants: tuple[InvariantRow, ...]
    violations: tuple[ViolationView, ...]
    timeline: Timeline
    events: tuple[EventRow, ...]
    ledger: tuple[LedgerRow, ...]
    shown: int
    total: int
    focus: tuple[str, ...] = ()  # the instances the event table keeps, when it keeps only some

    @property
    def cap_note(self) -> str:
        """"showing N of M events" when the cap (or the focus) hid some, else empty."""
        return f"showing {self.shown} of {self.total} events" if self.shown < self.total else ""

    def to_json(self) -> dict[str, Any]:
        """The verdict in machine-readable form, for tools that read a report instead of a terminal."""
        b = self.banner
        return {"valid": {"valid": True, "violated": False}.get(b.verdict), "run_id": b.run_id,
                "schedule": b.schedule, "target": b.target, "seed": b.seed, "reproduce": b.reproduce,
                "violations": [{"invariant": v.invariant, "instance": v.instance, "step": v.step,
                                "detail": v.detail, "events": [e.index for e in v.events]}
                               for v in self.violations],
                "unknown_reasons": list(b.unknown_reasons),
                "clock": "virtual" if b.virtual else "real time",
                "events": {"shown": self.shown, "total": self.total}}


def focus_instances(history: History, violations: Iterable[Any] = ()) -> tuple[str, ...]:
    """The instances a reader of this run wants first: those a violation names (itself or by its
    events), else those a fault fired on. Empty when there is none: then everything is shown."""
    named: list[str] = []
    events = history.events
    for v in violations:
        for inst in [v.instance] + [_instance_of(events[i]) for i in v.events if 0 <= i < len(events)]:
            if inst is not None and str(inst) not in named:
                named.append(str(inst))
    if not named:
        for hit in history.typed(PointHit):
            if hit.action and hit.instance is not None and hit.instance not in named:
                named.append(hit.instance)
    return tuple(named)


def _instance_of(e: Event) -> str | None:
    inst = about(e)[0]
    return None if inst is None else str(inst)


def build_run(result: RunResult, *, max_events: int = DEFAULT_MAX_EVENTS,
              reproduce: str | None = None, focus_table: bool = False) -> RunReport:
    """The model of one run's report, from a :class:`harness.run.RunResult`.

    At most ``max_events`` events are rendered (the first ones), plus every event a violation names
    so that each proof link resolves. The timeline follows the focus instances (see
    :func:`focus_instances`) and the harness; with ``focus_table`` the event table does too, which
    keeps a directory of many run reports small (the page says what it left out and how to get all).
    """
    if max_events < 1:
        raise ValueError(f"max_events={max_events}: a report must show at least one event")
    if reproduce is None:
        reproduce = result.config.reproduce_command()
    reproduce = redact(reproduce)
    history: History = result.history
    verdict = result.verdict
    events = history.events
    proof = {i for v in verdict.violations for i in v.events if 0 <= i < len(events)}
    focus = focus_instances(history, verdict.violations)
    # What each event is about, once (the table's columns, and what the focus follows).
    abouts = [about(e) for e in events]
    # Whether each event is about a focus instance, or about no instance at all (the harness's own).
    followed = [inst is None or str(inst) in focus for inst, _ in abouts] if focus else []
    kept = range(len(events)) if not (focus_table and focus) else [i for i, yes in enumerate(followed) if yes]
    shown = sorted(set(kept[:max_events]) | proof)
    t0 = events[0].time if events else 0

    ttl = result.config.timing.lease_ttl_ms if result.config.timing is not None else None
    drawn = shown if not focus else [i for i in shown if followed[i] or i in proof]
    timeline = build_timeline(history, shown=drawn, proof=proof, lease_ttl_ms=ttl, focus=focus)
    in_timeline = {i.index for i in timeline.items}
    by_index = {e.index: e for e in events}
    rows = tuple(_event_row(events[i], abouts[i], t0, i in proof, i in in_timeline) for i in shown)
    requests = {r.index: r for r in history.typed(Request)}
    ledger = tuple(_ledger_row(requests[i]) for i in shown if i in requests)

    schedule = str(result.config.schedule)
    violations = tuple(
        ViolationView(v.invariant, v.instance, v.step, v.detail,
                      tuple(EventRef(i, link(i), describe(by_index[i])) for i in v.events if i in by_index),
                      v.schedule or schedule, reproduce)
        for v in verdict.violations)
    invariants = tuple(InvariantRow(r.invariant, r.checked, r.valid, len(r.violations), r.detail,
                                    r.applicable) for r in verdict.results)
    c = result.config
    banner = Banner(
        verdict=verdict_word(verdict.valid), run_id=result.run_id, schedule=schedule,
        target=c.target_name, seed=c.seed, workers=c.workers, workload=c.workload_name, store=redact(c.store),
        duration_ms=round(result.duration_s * 1000, 1), spawned=result.spawned,
        fired=tuple((str(k), int(n)) for k, n in result.fired.items()),
        unfired=tuple(str(u) for u in result.unfired),
        unknown_reasons=tuple(str(r) for r in verdict.unknown_reasons),
        violated=tuple(dict.fromkeys(r.invariant for r in verdict.results if r.valid is False)),
        reproduce=reproduce, virtual=bool(c.virtual_time), run_time=run_time(span(history)),
        clock=clock_note(bool(c.virtual_time)),
        exercise=result.exercise.tally().line() if result.exercise is not None else "",
        provoked=tuple(_provoked_line(p) for p in result.exercise.faults) if result.exercise is not None else ())
    return RunReport(banner, invariants, violations, timeline, rows, ledger, len(shown), len(events),
                     focus if (focus_table and focus) else ())


def _provoked_line(p: Any) -> str:
    """What one fired fault provoked, in words (see :class:`killpoint.harness.exercise.Provoked`)."""
    if p.exempt:
        return f"{p.fault}: {p.exempt}"
    if p.action in ("kill", "terminate"):
        taken = f"its step taken up by {p.recovered_by}" if p.recovered_by else "its step not taken up again"
        return f"{p.fault}: {taken}"
    if p.takeover_by is None:
        return f"{p.fault}: no takeover" + (" (not exercised: not evidence for valid)" if not p.exercised else "")
    late = []
    if p.late_write:
        late.append(f"its late commit {p.late_write}")
    if p.late_call:
        late.append(f"its late call {p.late_call}")
    return (f"{p.fault}: taken over by {p.takeover_by} (its {p.takeover_evidence})"
            + (f"; {', '.join(late)}" if late else ""))


def _event_row(e: Event, about_it: tuple[Any, Any], t0: int, proof: bool, in_timeline: bool) -> EventRow:
    t = typed(e)
    status: str
    if isinstance(t, WorkerOp):
        status = t.type if t.type in STATUSES else "event"
    else:
        made = marking(t)
        status = made[0] if made else "event"
    # The table's columns: a request names its step in its meta, which its fields show.
    inst, step = (None, None) if isinstance(t, Request) else about_it
    return EventRow(e.index, link(e.index), round((e.time - t0) / 1e6, 3), e.process, e.kind, e.type,
                    status, "" if inst is None else str(inst), "" if step is None else str(step),
                    _fields(e), proof, in_timeline)


_PLAIN = re.compile(r'[^\s"=]+')  # a value written as it is: a word with no space, quote or "="


def _fields(e: Event) -> str:
    """The data of an event as ``key=value`` pairs, without the instance and step (they have
    columns of their own) and without the fields that are null; a value that is not a plain word
    is written as JSON."""
    parts = []
    for key, value in e.data.items():
        if value is None or key in ("instance", "step"):
            continue
        if isinstance(value, str) and _PLAIN.fullmatch(value):
            text = value
        elif type(value) is int:  # the commonest, without the JSON encoder
            text = str(value)
        elif type(value) is float and math.isfinite(value):
            text = repr(value)  # as JSON writes it
        elif type(value) is bool:
            text = "true" if value else "false"
        else:
            try:
                text = json.dumps(value, default=str, ensure_ascii=False)
            except (TypeError, ValueError):
                text = repr(value)
        parts.append(f"{key}={text}")
    return clip(" ".join(parts), DETAIL_CHARS)


def _ledger_row(r: Request) -> LedgerRow:
    status = "ok" if r.outcome in OK_OUTCOMES else "info" if r.outcome == vocab.DROPPED else "fail"
    return LedgerRow(r.index, link(r.index), r.seq, str(r.resource), r.key, str(r.scope or ""),
                     str(r.intent_hash or ""), r.fence, str(r.meta.worker or ""), r.meta.attempt, r.status,
                     r.outcome, r.applied, status)
