"""The history's events, typed: one frozen dataclass per family, parsed at one boundary.

A history is written by four sources in one vocabulary (:mod:`killpoint.vocab`) and stored as
JSON; :class:`~killpoint.harness.history.Event` keeps each event as it was written (its ``data``
a mapping of strings). :func:`parse` turns one into its typed form, once, and says what is wrong
with a bad one (:class:`~killpoint.errors.InvalidEvent`, naming the event, its kind and the field),
so a reader asks ``hit.action`` and mypy refuses a kind no writer writes.

The families:

* :class:`StoreEvent` -- the store's event table (or a target's ``history()`` hook): a step's
  transitions and leases;
* :class:`Request` -- one row of the downstream's ledger, with the :class:`RequestMeta` the worker sent;
* :class:`WorkerOp` -- an operation of a worker (claim, call, receipt, commit), invoked then
  completed ``ok`` / ``fail`` / ``info``;
* :class:`PointHit` -- a failpoint hit (``action`` is ``None`` when nothing fired);
* :class:`WorkerEvent` -- a worker's other facts (recover, checkpoint, raised, heartbeat lost...);
* :class:`TargetEvent` -- what a target journals under a kind of its own (``ctx.journal`` is
  public): kept, read by no checker;
* :class:`HarnessAction` -- what the harness did (spawn, kill, stop, exit, restarts...).

The kinds are ``Literal`` types whose strings are the vocabulary's (``tests/test_events.py`` holds
each to its constants in :mod:`killpoint.vocab`). To add a kind: its constant in ``vocab``, its
string in the family's ``Literal`` below; a harness action with fields of its own gets a subclass
of :class:`HarnessAction` registered in :data:`HARNESS_CLASSES`. Fields a family does not name
stay in ``extra``, so nothing written is lost.

This module imports only the vocabulary and the errors: the history imports it, not the reverse.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Protocol, TypeVar, Union, get_args

from killpoint import vocab as v
from killpoint.errors import InvalidEvent, shown

StoreKind = Literal["created", "claimed", "committed", "commit_rejected", "renewed", "released",
                    "receipt_recorded", "stuck_flagged", "operator_resolved", "approved"]
Outcome = Literal["applied", "declined", "replay", "conflict", "in_flight", "missing_key",
                  "stale_fence", "error", "dropped"]
OpKind = Literal["claim", "call", "receipt", "commit"]
OpType = Literal["invoke", "ok", "fail", "info"]
WorkerKind = Literal["recover", "checkpoint", "heartbeat_lost", "store_unavailable", "start", "finish",
                     "raised", "activity", "replay", "library_error", "lease_lost"]
HarnessKind = Literal["spawn", "kill", "stop", "cont", "exit", "bound_hit", "downstream_restart",
                      "store_restart", "target_restart", "after_quiescent", "terminate_backend",
                      "infrastructure_failure", "starved", "replacements_stopped", "late_grace_over"]


class RawEvent(Protocol):
    """An event as the history stores it (:class:`killpoint.harness.history.Event`)."""

    @property
    def index(self) -> int: ...
    @property
    def time(self) -> int: ...
    @property
    def process(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def data(self) -> Mapping[str, Any]: ...


# Every typed event starts with where it stands in the history (index, time) and keeps the fields
# its family does not name in ``extra``. kw_only: the families add fields with defaults freely.
@dataclass(frozen=True, slots=True, kw_only=True)
class _Typed:
    index: int
    time: int
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreEvent(_Typed):
    """A store event: ``fence`` is the lease version its writer held, ``lease_version`` and
    ``state_version`` the step's after it."""

    kind: StoreKind
    instance: str | None = None
    step: str | None = None
    worker: str | None = None
    from_state: str | None = None
    to_state: str | None = None
    state_version: int | None = None
    fence: int | None = None
    lease_version: int | None = None
    attempt: int | None = None
    actor: str | None = None  # operator events
    evidence: Any = None  # operator events
    seq: int | None = None

    process: typing.ClassVar[str] = v.STORE
    type: typing.ClassVar[str] = v.EVENT

    @property
    def accepted(self) -> bool:
        """Whether it changed the step (``commit_rejected``, ``renewed``... did not)."""
        return self.kind in v.ACCEPTED_TRANSITIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestMeta:
    """What a worker sent with a downstream request to say which step it is for."""

    instance: str | None = None
    step: str | None = None
    worker: str | None = None
    attempt: int | None = None
    direction: str | None = None  # forward | compensation; None: a worker that did not say
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Request(_Typed):
    """One request the downstream received, applied or not (``applied``: a new effect happened;
    ``dropped`` is applied without an answer sent)."""

    kind: Literal["request"] = "request"
    outcome: Outcome
    applied: bool
    seq: int | None = None
    resource: str | None = None
    key: str | None = None  # None: a legacy request
    scope: str | None = None
    fence: int | None = None
    intent_hash: str | None = None
    status: int | None = None
    params: Any = None
    meta: RequestMeta = field(default_factory=RequestMeta)

    process: typing.ClassVar[str] = v.DOWNSTREAM
    type: typing.ClassVar[str] = v.EVENT


@dataclass(frozen=True, slots=True, kw_only=True)
class _OfWorker(_Typed):
    process: str  # the worker incarnation ("A", "B", "A.2")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOp(_OfWorker):
    """An operation of a worker; an ``invoke`` and its completion share ``op``. ``indeterminate``:
    the worker died before the answer, and the history closed the operation ``info``."""

    kind: OpKind
    type: OpType
    op: int | None = None
    instance: str | None = None
    step: str | None = None
    resource: str | None = None
    key: str | None = None
    intent_hash: str | None = None
    fence: int | None = None
    attempt: int | None = None
    direction: str | None = None
    to_state: str | None = None
    status: Any = None  # an HTTP code for a call, a receipt's status for a receipt
    error: str | None = None
    indeterminate: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PointHit(_OfWorker):
    """A failpoint hit; ``action`` is the action that fired, ``None`` when nothing did."""

    kind: Literal["point"] = "point"
    point: str
    instance: str | None = None
    step: str | None = None
    hit: int | None = None
    action: str | None = None
    fault: int | None = None  # the index of the fault in the schedule that fired

    type: typing.ClassVar[str] = v.EVENT


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerEvent(_OfWorker):
    """A worker's plain fact other than a point hit; which fields it has depends on its kind
    (harness/history.py's docstring lists them)."""

    kind: WorkerKind
    instance: str | None = None
    step: str | None = None
    fence: int | None = None
    worker: str | None = None
    pid: int | None = None
    action: str | None = None  # recover: what it decided
    outcome: str | None = None  # checkpoint, replay
    reason: str | None = None  # checkpoint
    error: str | None = None  # raised, store_unavailable, library_error, lease_lost

    type: typing.ClassVar[str] = v.EVENT


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetEvent(_OfWorker):
    """An entry a target journaled under a kind killpoint does not know (its own): kept so the
    report shows it, judged by no checker."""

    kind: str
    type: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessAction(_Typed):
    """What the harness did. The fields most kinds share are named; the rest of a kind's detail is
    in ``extra`` unless the kind has a class of its own in :data:`HARNESS_CLASSES`."""

    kind: HarnessKind
    worker: str | None = None
    pid: int | None = None
    signal: str | None = None
    reason: str | None = None
    code: int | None = None  # exit
    error: str | None = None  # replacements_stopped, infrastructure_failure

    process: typing.ClassVar[str] = v.HARNESS
    type: typing.ClassVar[str] = v.EVENT


# A harness kind whose detail deserves fields of its own maps to a subclass of HarnessAction here.
HARNESS_CLASSES: dict[str, type[HarnessAction]] = {}

TypedEvent = Union[StoreEvent, Request, WorkerOp, PointHit, WorkerEvent, TargetEvent, HarnessAction]


# -- the parse boundary ----------------------------------------------------------------------------

_NONE = type(None)


def _accepts(annotation: Any) -> tuple[type, ...] | None:
    """The runtime types a field's annotation accepts; None: anything."""
    if annotation is Any:
        return None
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        parts = [_accepts(a) for a in get_args(annotation)]
        if any(p is None for p in parts):
            return None
        return tuple(t for p in parts if p is not None for t in p)
    if origin is Literal:
        return (str,)
    if annotation is type(None):
        return (_NONE,)
    if annotation is float:
        return (int, float)
    if isinstance(annotation, type):
        return (annotation,)
    return None  # Mapping, RequestMeta...: checked where they are built


@dataclass(frozen=True)
class _Spec:
    """How to fill one family's class from an event's data: its fields, and what each accepts."""

    cls: type
    fields: tuple[tuple[str, tuple[type, ...] | None, tuple[str, ...] | None], ...]

    @classmethod
    def of(cls, family: type) -> _Spec:
        hints = typing.get_type_hints(family)
        out = []
        for f in dataclasses.fields(family):
            if f.name in ("index", "time", "extra", "process", "kind", "type", "meta"):
                continue
            hint = hints[f.name]
            literal = tuple(get_args(hint)) if typing.get_origin(hint) is Literal else None
            out.append((f.name, _accepts(hint), literal))
        return cls(family, tuple(out))


def _check(raw: RawEvent, family: str, name: str, value: Any, accepts: tuple[type, ...] | None,
           literal: tuple[str, ...] | None) -> None:
    if accepts is not None and (not isinstance(value, accepts) or
                                (isinstance(value, bool) and bool not in accepts)):
        want = " or ".join("None" if t is _NONE else t.__name__ for t in accepts)
        raise _bad(raw, name, f"{family} event's {name} is {shown(value)} ({type(value).__name__}); "
                           f"it must be {want}")
    if literal is not None and value not in literal:
        raise _bad(raw, name, f"{family} event's {name} is {shown(value)}; it is one of "
                           f"{', '.join(literal)}")


_T = TypeVar("_T", bound=_Typed)


def _fill(cls: type[_T], raw: RawEvent, family: str, data: Mapping[str, Any], **given: Any) -> _T:
    spec = _spec(cls)
    values: dict[str, Any] = {}
    for name, accepts, literal in spec.fields:
        if name in data:
            value = data[name]
            _check(raw, family, name, value, accepts, literal)
            values[name] = value
        elif name in _REQUIRED.get(spec.cls, ()):
            raise _bad(raw, name, f"{family} event has no {name}")
    named = _NAMED[spec.cls]
    extra = {k: x for k, x in data.items() if k not in named}
    return cls(index=raw.index, time=raw.time, extra=extra, **values, **given)


def _bad(raw: RawEvent, name: str, problem: str) -> InvalidEvent:
    return InvalidEvent(f"event {raw.index} ({raw.process}, kind {shown(raw.kind)}): {problem}",
                        index=raw.index, process=raw.process, kind=raw.kind, field=name)


def _kind(raw: RawEvent, family: str, kinds: tuple[str, ...]) -> None:
    if raw.kind not in kinds:
        raise _bad(raw, "kind", f"{shown(raw.kind)} is not a kind of {family} event; the kinds are "
                           f"{', '.join(sorted(kinds))}")


_STORE_KINDS = get_args(StoreKind)
_OUTCOMES = get_args(Outcome)
_OP_KINDS = get_args(OpKind)
_OP_TYPES = get_args(OpType)
_WORKER_KINDS = get_args(WorkerKind)
_HARNESS_KINDS = get_args(HarnessKind)
_SPECS: dict[type, _Spec] = {}
_NAMED: dict[type, frozenset[str]] = {}
# Fields without a default: an event of the family must have them.
_REQUIRED: dict[type, frozenset[str]] = {}


def _spec(family: type) -> _Spec:
    spec = _SPECS.get(family)
    if spec is None:
        spec = _SPECS[family] = _Spec.of(family)
        _NAMED[family] = frozenset(f.name for f in dataclasses.fields(family))
        _REQUIRED[family] = frozenset(
            f.name for f in dataclasses.fields(family)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            and f.name not in ("index", "time", "process", "kind", "type"))
    return spec


def _meta(raw: RawEvent, data: Mapping[str, Any]) -> RequestMeta:
    meta = data.get("meta")
    if meta is None:
        return RequestMeta()
    if not isinstance(meta, Mapping):
        raise _bad(raw, "meta", f"request's meta is {shown(meta)}; it must be a mapping")
    values: dict[str, Any] = {}
    for name, accepts, literal in _spec(RequestMeta).fields:
        if name in meta:
            _check(raw, "request meta", name, meta[name], accepts, literal)
            values[name] = meta[name]
    named = _NAMED[RequestMeta]
    return RequestMeta(extra={k: x for k, x in meta.items() if k not in named}, **values)


def parse(raw: RawEvent) -> TypedEvent:
    """The typed form of one event of a history; :class:`~killpoint.errors.InvalidEvent` names
    the event, its kind and the field when it is not one the vocabulary has."""
    data = raw.data
    process = raw.process
    if process == v.STORE:
        _kind(raw, "store", _STORE_KINDS)
        return _fill(StoreEvent, raw, "store", data, kind=raw.kind)
    if process == v.DOWNSTREAM:
        _kind(raw, "ledger", ("request",))
        return _fill(Request, raw, "request", data,
                     meta=_meta(raw, data))
    if process == v.HARNESS:
        _kind(raw, "harness", _HARNESS_KINDS)
        family = HARNESS_CLASSES.get(raw.kind, HarnessAction)
        return _fill(family, raw, raw.kind, data, kind=raw.kind)
    if raw.type in _OP_TYPES:
        if raw.kind not in _OP_KINDS:
            return TargetEvent(index=raw.index, time=raw.time, extra=dict(data), process=process,
                               kind=raw.kind, type=raw.type)
        return _fill(WorkerOp, raw, raw.kind, data,
                     process=process, kind=raw.kind, type=raw.type)
    if raw.type != v.EVENT:
        raise _bad(raw, "type", f"{shown(raw.type)} is not an event type; the types are "
                           f"{', '.join((*_OP_TYPES, v.EVENT))}")
    if raw.kind == v.POINT:
        return _fill(PointHit, raw, "point", data, process=process)
    if raw.kind in _WORKER_KINDS:
        return _fill(WorkerEvent, raw, raw.kind, data,
                     process=process, kind=raw.kind)
    if raw.kind in _OP_KINDS:
        raise _bad(raw, "type", f"a {raw.kind} is an operation: its type is one of {', '.join(_OP_TYPES)}, "
                           f"not {shown(raw.type)}")
    return TargetEvent(index=raw.index, time=raw.time, extra=dict(data), process=process, kind=raw.kind,
                       type=raw.type)


@dataclass(frozen=True)
class _Row:
    index: int
    time: int
    process: str
    kind: str
    type: str
    data: Mapping[str, Any]


def parse_store_row(row: Mapping[str, Any], *, index: int) -> StoreEvent:
    """A store event given as one row, ``kind`` and fields side by side (a target's ``history()``
    hook gives these); ``index`` is its place among the rows, which an error names."""
    data = {k: x for k, x in row.items() if k not in ("t", "kind")}
    t = row.get("t")
    raw = _Row(index, t if isinstance(t, int) else 0, v.STORE, row.get("kind", ""), v.EVENT, data)
    typed = parse(raw)
    assert isinstance(typed, StoreEvent)  # the store's process parses to nothing else
    return typed
