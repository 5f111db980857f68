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
It is one module, over 500 lines, on purpose: the families and the one function that makes them
are read together (a field added to a family is parsed by its annotation, nothing else).
"""

from __future__ import annotations

import dataclasses
import types
from collections import abc
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
                     "raised", "activity", "replay", "library_error", "lease_lost", "sometimes"]
HarnessKind = Literal["spawn", "kill", "stop", "cont", "exit", "bound_hit", "downstream_restart",
                      "store_restart", "target_restart", "after_quiescent", "terminate_backend",
                      "infrastructure_failure", "starved", "replacements_stopped", "late_grace_over",
                      "unfired_given_up", "held"]


FORWARD = "forward"
COMPENSATION = "compensation"


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
# its family does not name in ``extra``. kw_only: the families add fields with defaults freely. No
# slots: an event holds only the fields it was given, the rest are the class's defaults (see _made).
@dataclass(frozen=True, kw_only=True)
class _Typed:
    index: int
    time: int
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
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
    key: str | None = None  # receipt_recorded: the key and the status recorded under it
    status: str | int | None = None  # (a commit's detail may carry the HTTP status that caused it)
    reason: Any = None  # commit_rejected: what its writer said
    expected_state_version: int | None = None  # commit_rejected
    current_owner: str | None = None  # commit_rejected
    stuck_owner: str | None = None  # stuck_flagged: the worker whose lease was freed
    idle_ms: float | None = None  # stuck_flagged: how long its step had made no progress
    seq: int | None = None

    process: typing.ClassVar[str] = v.STORE
    type: typing.ClassVar[str] = v.EVENT

    @property
    def accepted(self) -> bool:
        """Whether it changed the step (``commit_rejected``, ``renewed``... did not)."""
        return self.kind in v.ACCEPTED_TRANSITIONS


@dataclass(frozen=True, kw_only=True)
class RequestMeta:
    """What a worker sent with a downstream request to say which step it is for."""

    instance: str | None = None
    step: str | None = None
    worker: str | None = None
    attempt: int | None = None
    direction: str | None = None  # forward | compensation; None: a worker that did not say
    extra: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
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

    @property
    def direction(self) -> str:
        """forward or compensation, as the worker said; forward when it did not say."""
        return self.meta.direction or FORWARD


@dataclass(frozen=True, kw_only=True)
class _OfWorker(_Typed):
    process: str  # the worker incarnation ("A", "B", "A.2")


@dataclass(frozen=True, kw_only=True)
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
    expected_state_version: int | None = None  # commit
    status: Any = None  # an HTTP code for a call, a receipt's status for a receipt
    replay: bool | None = None  # call: the downstream answered from its record of the key
    error: str | None = None
    indeterminate: bool = False


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
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
    reason: Any = None  # checkpoint
    error: str | None = None  # raised, store_unavailable, library_error, lease_lost
    # recover: the evidence
    receipt: str | None = None
    source: str | None = None
    retry_safe: bool | None = None
    attempts: int | None = None
    max_attempts: int | None = None
    outcome_unknown: bool | None = None  # store_unavailable: COMMIT was sent, its answer lost
    exception: str | None = None  # raised: the exception's type, where, and its traceback
    where: str | None = None
    traceback: str | None = None
    history: str | None = None  # replay: the recorded history, the workflow it was replayed against
    workflow: str | None = None
    detail: str | None = None  # replay: what went wrong
    name: str | None = None  # sometimes: the expectation
    reached: bool | None = None  # sometimes: whether it held there

    type: typing.ClassVar[str] = v.EVENT


@dataclass(frozen=True, kw_only=True)
class TargetEvent(_OfWorker):
    """An entry a target journaled under a kind killpoint does not know (its own): kept so the
    report shows it, judged by no checker."""

    kind: str
    type: str

    # What the target wrote is not checked; where it names a step as killpoint's events do, a
    # narration follows it with that step.
    @property
    def instance(self) -> Any:
        return self.extra.get("instance")

    @property
    def step(self) -> Any:
        return self.extra.get("step")

    @property
    def fence(self) -> Any:
        return self.extra.get("fence")


@dataclass(frozen=True, kw_only=True)
class HarnessAction(_Typed):
    """What the harness did. The fields most kinds share are named; the rest of a kind's detail is
    in ``extra`` unless the kind has a class of its own in :data:`HARNESS_CLASSES`."""

    kind: HarnessKind
    worker: str | None = None
    pid: int | None = None
    signal: str | int | None = None  # the harness writes its name (SIGKILL); a number is taken too
    reason: str | None = None
    code: int | None = None  # exit
    error: str | None = None  # replacements_stopped, infrastructure_failure
    instance: str | None = None  # stop, terminate_backend: the step the worker was at
    step: str | None = None

    process: typing.ClassVar[str] = v.HARNESS
    type: typing.ClassVar[str] = v.EVENT


@dataclass(frozen=True, kw_only=True)
class Spawn(HarnessAction):
    identity: str | None = None  # the identity the store sees (a replacement may reuse the dead one's)


@dataclass(frozen=True, kw_only=True)
class BoundHit(HarnessAction):
    seconds: float | None = None  # the bound hit (reason says why when it was not time)
    clock: str | None = None  # "run": the run clock's bound, else the wall clock's


@dataclass(frozen=True, kw_only=True)
class DownstreamRestart(HarnessAction):
    fault: str | None = None
    pid_before: int | None = None
    address: Any = None  # the same address it served before


@dataclass(frozen=True, kw_only=True)
class TargetRestart(HarnessAction):
    fault: str | None = None
    ok: bool | None = None


@dataclass(frozen=True, kw_only=True)
class StoreRestart(HarnessAction):
    fault: str | None = None
    killed: tuple[str, ...] | list[str] = ()  # the workers killed with their connections


@dataclass(frozen=True, kw_only=True)
class TerminateBackend(HarnessAction):
    point: str | None = None
    fault: Any = None
    backend_pids: Any = ()  # the worker's PostgreSQL sessions ended
    states: Any = None  # pid -> the state each was in


@dataclass(frozen=True, kw_only=True)
class Starved(HarnessAction):
    ms: float | None = None  # how far the harness's own wait overran


@dataclass(frozen=True, kw_only=True)
class LateGraceOver(HarnessAction):
    workers: tuple[str, ...] | list[str] = ()
    seconds: float | None = None
    wall_s: float | None = None
    capped: bool | None = None


@dataclass(frozen=True, kw_only=True)
class InfrastructureFailure(HarnessAction):
    phase: str | None = None


@dataclass(frozen=True, kw_only=True)
class UnfiredGivenUp(HarnessAction):
    """``unfired_given_up``: the target's done() said the work was finished for ``seconds`` with
    ``faults`` still unfired; the run ended instead of waiting out its bound."""

    faults: tuple[str, ...] | list[str] = ()
    seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class Stop(HarnessAction):
    """``stop``: a worker frozen at a pause; ``until`` the resume moment its schedule named (a crash
    point, or ``lapse``; None: once its step moved on)."""

    instance: str | None = None
    step: str | None = None
    until: str | None = None


@dataclass(frozen=True, kw_only=True)
class Resume(HarnessAction):
    """``cont``: a frozen worker resumed (a signal), or a worker that waited released (no signal).
    ``why`` says why (``vocab.RESUMED``; for a held worker's release ``late_attempt_over`` or
    ``blocked``), ``moment`` the moment its pause named, ``by`` the worker that reached it,
    ``frozen`` (a release) the worker whose late attempt it was held for."""

    why: str | None = None
    moment: str | None = None
    by: str | None = None
    frozen: str | None = None


@dataclass(frozen=True, kw_only=True)
class Held(HarnessAction):
    """``held``: a worker that reached ``frozen``'s resume moment waits at ``point`` of
    ``instance``/``step`` while that one makes its late attempt."""

    point: str | None = None
    instance: str | None = None
    step: str | None = None
    frozen: str | None = None


# A harness kind whose detail deserves fields of its own maps to its subclass of HarnessAction.
HARNESS_CLASSES: dict[str, type[HarnessAction]] = {
    v.SPAWN: Spawn, v.BOUND_HIT: BoundHit, v.DOWNSTREAM_RESTART: DownstreamRestart,
    v.TARGET_RESTART: TargetRestart, v.STORE_RESTART: StoreRestart,
    v.TERMINATE_BACKEND: TerminateBackend, v.STARVED: Starved, v.LATE_GRACE_OVER: LateGraceOver,
    v.INFRASTRUCTURE_FAILURE: InfrastructureFailure, v.UNFIRED_GIVEN_UP: UnfiredGivenUp,
}

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
    if origin in (list, tuple, dict):
        return (origin,)
    if annotation is type(None):
        return (_NONE,)
    if annotation is float:
        return (int, float)
    if isinstance(annotation, type):
        return (annotation,)
    return None  # Mapping, RequestMeta...: checked where they are built


# A field's check: the exact types it accepts (the fast path: JSON and database values come in
# these), the types a subclass of which it accepts too (None: anything), and, for a Literal, its strings.
_Check = tuple[frozenset[type], "tuple[type, ...] | None", "frozenset[str] | None"]


@dataclass(frozen=True)
class _Spec:
    """How to fill one family's class from an event's data: a check per field, the fields an event
    must have, and every name the class has (the rest of the data goes to ``extra``)."""

    checks: dict[str, _Check]
    required: tuple[str, ...]
    named: frozenset[str]

    @classmethod
    def of(cls, family: type) -> _Spec:
        hints = typing.get_type_hints(family)
        fields = dataclasses.fields(family)
        checks: dict[str, _Check] = {}
        for f in fields:
            if f.name in _GIVEN:
                continue
            hint = hints[f.name]
            accepts = _accepts(hint)
            literal = frozenset(get_args(hint)) if typing.get_origin(hint) is Literal else None
            checks[f.name] = (frozenset(accepts or ()), accepts, literal)
        required = tuple(f.name for f in fields if f.name not in _GIVEN and f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
        return cls(checks, required, frozenset(f.name for f in fields))


# Fields the parse fills from the event itself, never from its data.
_GIVEN = frozenset({"index", "time", "extra", "process", "kind", "type", "meta"})


def _checked(raw: RawEvent, family: str, name: str, value: Any, check: _Check) -> None:
    exact, accepts, literal = check
    if accepts is not None and type(value) not in exact and (
            not isinstance(value, accepts) or isinstance(value, bool)):  # a bool is no int here
        want = " or ".join("None" if t is _NONE else t.__name__ for t in accepts)
        raise _bad(raw, name, f"{family} event's {name} is {shown(value)} ({type(value).__name__}); "
                              f"it must be {want}")
    if literal is not None and value not in literal:
        raise _bad(raw, name, f"{family} event's {name} is {shown(value)}; it is one of "
                              f"{', '.join(sorted(literal))}")


def _fields(spec: _Spec, raw: RawEvent, family: str,
            data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values of the family's fields in ``data``, checked, and the rest (its ``extra``)."""
    checks = spec.checks
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    named = spec.named
    for name, value in data.items():
        check = checks.get(name)
        if check is None:
            if name not in named:
                extra[name] = value
            continue
        if type(value) not in check[0] or check[2] is not None:  # else it is surely good
            _checked(raw, family, name, value, check)
        values[name] = value
    for name in spec.required:
        if name not in values:
            raise _bad(raw, name, f"{family} event has no {name}")
    return values, extra


_T = TypeVar("_T", bound=_Typed)
_U = TypeVar("_U")


_new = object.__new__


def _fill(cls: type[_T], raw: RawEvent, family: str, data: Mapping[str, Any], **given: Any) -> _T:
    values, extra = _fields(_SPECS.get(cls) or _spec(cls), raw, family, data)
    values.update(given, index=raw.index, time=raw.time, extra=extra)
    return _made(cls, values)


def _made(cls: type[_U], values: dict[str, Any]) -> _U:
    """An instance of a family's frozen class from checked values, without its ``__init__``: a
    frozen dataclass sets each of its twenty-odd fields through ``object.__setattr__``, which made
    parsing a history cost seven times what judging it did. Only the fields given are stored; the
    others read the class's defaults (every field without a plain default is always given)."""
    made = _new(cls)
    made.__dict__.update(values)
    return made


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


def _spec(family: type) -> _Spec:
    spec = _SPECS.get(family)
    if spec is None:
        spec = _SPECS[family] = _Spec.of(family)
    return spec


def _meta(raw: RawEvent, data: Mapping[str, Any]) -> RequestMeta:
    meta = data.get("meta")
    if meta is None:
        return RequestMeta()
    if type(meta) is not dict and not isinstance(meta, abc.Mapping):
        raise _bad(raw, "meta", f"request's meta is {shown(meta)}; it must be a mapping")
    values, extra = _fields(_spec(RequestMeta), raw, "request meta", meta)
    values["extra"] = extra
    return _made(RequestMeta, values)


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
