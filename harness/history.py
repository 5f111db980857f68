"""The history of one run: every recorded operation, from every source, in one order.

A history merges four sources, ordered by ``CLOCK_MONOTONIC`` (``time.monotonic_ns()``, which
is one clock for every process on a Linux machine):

* **worker journals** (``process`` = the worker incarnation, e.g. ``"A"``, ``"B"``, ``"A.2"``):
  operations as Jepsen writes them, an ``invoke`` then ``ok`` / ``fail``; when the worker died
  before it saw the answer, :func:`merge` closes the operation with ``info`` (indeterminate).
  Kinds: ``claim``, ``call``, ``receipt``, ``commit`` (op kinds) and ``point`` (type ``event``:
  a failpoint hit, ``data`` = point, instance, step, hit, action -- ``action`` is ``None`` when
  nothing fired), ``recover`` (type ``event``: evidence and the action decided), ``heartbeat_lost``,
  ``checkpoint`` (type ``event``: instance, outcome, reason, fingerprint; written when a worker
  did not read an instance's checkpoint as is: migrated or refused), ``raised`` (type ``event``:
  error, exception, where, traceback -- the target raised an exception nobody injected),
  ``sometimes`` (type ``event``: name, reached, instance, step -- ``killpoint.sometimes(name,
  condition)`` evaluated; see :mod:`killpoint.harness.exercise`),
  ``library_error`` (procrastinate: error) and ``lease_lost`` (langgraph: instance, fence, error).
  A kind a target journals for itself is kept and judged by no checker.
  ``call`` invoke data: instance, step, resource, key, intent_hash, fence, attempt, direction.
* **store events** (``process`` = ``"store"``, type ``event``): the append-only event table.
  ``kind`` is one of ``created``, ``claimed``, ``committed``, ``commit_rejected``,
  ``receipt_recorded``, ``stuck_flagged``, ``operator_resolved``, ``approved``, ``renewed`` (a
  heartbeat extended a lease), ``released`` (a holder gave its lease up without a transition).
  ``data`` has
  instance, step, worker, from_state, to_state, state_version (after the event), fence (the lease
  version the writer held), lease_version (the step's current one after the event), attempt,
  actor and evidence (operator events) and any extra detail.
  Accepted transitions are ``claimed``, ``committed``, ``operator_resolved``, ``approved``;
  ``commit_rejected`` changes nothing. For a target that owns its state (``History.owns_state``)
  these are the events its ``history()`` hook gave, in the same vocabulary.
* **the downstream ledger** (``process`` = ``"downstream"``, kind ``request``, type ``event``): one
  row per request, applied or not. ``data``: seq, resource, key (``None`` for legacy), scope,
  fence, intent_hash, params, meta (instance, step, worker, attempt, direction), status (HTTP
  code), outcome (``applied``, ``declined``, ``replay``, ``conflict``, ``in_flight``,
  ``missing_key``, ``stale_fence``, ``error``, ``dropped``), applied (bool: a new effect happened).
  ``dropped`` means applied but the answer was never sent (so ``applied`` is true).
* **harness actions** (``process`` = ``"harness"``, type ``event``): ``spawn`` (worker, pid),
  ``kill`` / ``stop`` / ``cont`` (worker, pid, signal, reason; a ``cont`` without a signal is a
  release of a worker that was never stopped; ``stop`` has ``until``, the resume moment the pause
  named, and ``cont`` has ``moment`` (that moment) and ``why``, one of ``vocab.RESUMED`` (or, for a
  held worker's release, ``late_attempt_over`` / ``blocked``, with ``frozen``), and ``by``, the worker
  that reached the moment), ``held`` (worker, pid, point, instance, step, frozen: a worker that reached
  the resume moment of the frozen worker ``frozen`` waits there while that one goes on),
  ``exit`` (worker, pid, code, signal), ``bound_hit``,
  ``downstream_restart`` (pid_before, pid, url: same ledger, same port), ``store_restart`` (the
  workers killed with their connections), ``after_quiescent`` (an outside actor, such as an operator,
  acts before judging), ``terminate_backend`` (worker, pid, point, instance, step, fault,
  backend_pids: the worker's PostgreSQL sessions ended by ``pg_terminate_backend``, states: the
  state each was in -- ``idle`` at ``in_db_commit`` means its COMMIT had been processed),
  ``replacements_stopped`` (worker, error: the target raised the same exception again),
  ``target_restart`` (fault, ok: the target's own server restarted by its ``restart()`` hook),
  ``unfired_given_up`` (faults, seconds: a target's done() said the work was finished that long
  with these faults still unfired, and the run ended rather than wait out its bound).

Each :class:`Event` keeps what was written; ``Event.typed`` is its family's typed form
(:mod:`killpoint.harness.events`), parsed once, with a named error for an event not in the vocabulary.

Checkers only ever see a :class:`History`; they never do I/O.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Generator, Iterable, Iterator, Mapping, TypeVar, cast

from killpoint import vocab as v
from killpoint.errors import InvalidEvent
from killpoint.harness.events import Request, StoreEvent, TypedEvent, parse
# Re-exported: the names the checkers and reports have always imported from here.
from killpoint.vocab import ACCEPTED_TRANSITIONS as ACCEPTED_TRANSITIONS
from killpoint.vocab import NON_WORKERS as NON_WORKERS
from killpoint.vocab import OP_KINDS as OP_KINDS

_F = TypeVar("_F")  # a family of typed events


@dataclass(frozen=True)
class Event:
    index: int
    time: int  # CLOCK_MONOTONIC nanoseconds, plus the run clock's offset then in force (harness.clock)
    process: str
    kind: str
    type: str  # invoke | ok | fail | info | event
    data: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @cached_property
    def typed(self) -> TypedEvent:
        """The event in its family's typed form (:mod:`killpoint.harness.events`), parsed on first
        use; :class:`~killpoint.errors.InvalidEvent` when it is not in the vocabulary."""
        return parse(self)

    @property
    def meta(self) -> Mapping[str, Any]:
        """The ``meta`` a worker sent with a downstream request (instance, step, worker, attempt,
        direction); empty for any other event."""
        meta = self.data.get("meta")
        if type(meta) is dict:  # the common case, without the slow abstract isinstance
            return meta
        return meta if isinstance(meta, Mapping) else {}

    @property
    def is_worker(self) -> bool:
        """Whether a worker incarnation wrote it (not the store, the downstream or the harness)."""
        return self.process not in NON_WORKERS

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "time": self.time, "process": self.process,
                "kind": self.kind, "type": self.type, "data": dict(self.data)}


@dataclass(frozen=True)
class StepConfig:
    """What the checkers need to know about one step of one instance."""

    instance: str
    step: str
    resource: str | None  # None: a pure step with no downstream effect
    key: str | None  # the forward idempotency key (None for legacy or pure steps)
    legacy: bool = False
    max_attempts: int = 3
    compensation_key: str | None = None


@dataclass(frozen=True)
class History:
    events: tuple[Event, ...]
    steps: tuple[StepConfig, ...] = ()
    # final rows of the steps table: instance, step, state, state_version, attempt, lease_version, owner
    final: tuple[Mapping[str, Any], ...] = ()
    schedule: str = ""
    # quiescent: the run ended with every worker exited and nothing left to do.
    quiescent: bool = True
    bound_hit: bool = False
    stuck_bound_ms: float = 1000.0
    stuck_slack_ms: float = 500.0
    # The harness's own verdict on each instance's stored checkpoint, the one a correct worker
    # reaches (harness.checkpoint.verify): instance, outcome (ok | migrated | refused), reason.
    # The checkers cannot read the store, so the oracle's answer travels in the history.
    checkpoints: tuple[Mapping[str, Any], ...] = ()
    # The target keeps its state in a store of its own: killpoint's store events and final rows are
    # not the target's, and only what its hooks gave (store events, final states) stands for them.
    owns_state: bool = False

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def of(self, process: str | None = None, kind: str | None = None) -> list[Event]:
        if process is not None:
            events: Iterable[Event] = self._by_process.get(process, ())
            return [e for e in events if kind is None or e.kind == kind]
        return [e for e in self.events if kind is None or e.kind == kind]

    def of_workers(self, kind: str | None = None) -> list[Event]:
        """The events of every worker incarnation (any process but store, downstream, harness),
        in history order."""
        return [e for e in self._worker_events if kind is None or e.kind == kind]

    def store_by_step(self) -> Mapping[tuple[Any, Any], list[StoreEvent]]:
        """The store's events, typed, grouped by (instance, step), each group in history order.
        Shared by every checker that follows one step's chain (read it, never change it)."""
        return self._typed_store_by_step

    # -- the typed events (killpoint.harness.events): what checkers, narration and reports read ---
    def typed(self, family: type[_F]) -> list[_F]:
        """Every event of one family (``StoreEvent``, ``Request``, ``WorkerOp``, ``PointHit``,
        ``WorkerEvent``, ``HarnessAction`` or one of its kinds...), typed, in history order.
        Shared (read it, never change it); the first call parses the whole history. An event not
        in the vocabulary is in no family: it is in :attr:`invalid`, which makes a verdict unknown."""
        return self._parsed[0].get(family, [])  # type: ignore[return-value]

    @property
    def typed_events(self) -> list[TypedEvent]:
        """Every event of the history, typed, in order (those in :attr:`invalid` left out)."""
        return self._parsed[0].get(object, [])

    @property
    def invalid(self) -> tuple[InvalidEvent, ...]:
        """What is wrong with each event that is not in the vocabulary, in history order."""
        return self._parsed[1]

    def parsing(self) -> Generator[None, None, None]:
        """Parse every event into its typed form a piece at a time (a harness with workers to
        answer looks at them in between); :meth:`typed` then only gathers them."""
        events = self.events
        for start in range(0, len(events), _PARSE_PIECE):
            for e in events[start:start + _PARSE_PIECE]:
                try:
                    _ = e.typed
                except InvalidEvent:
                    pass  # gathered into invalid
            yield

    def effects(self) -> list[Request]:
        """The ledger's requests where a new effect really happened (``dropped`` included)."""
        return self._effects

    def step_config(self, instance: str, step: str) -> StepConfig | None:
        return self._step_configs.get((instance, step))

    def checkpoint(self, instance: str) -> Mapping[str, Any] | None:
        """The oracle's verdict on ``instance``'s stored checkpoint, if the run recorded one."""
        return self._checkpoints.get(instance)

    def final_state(self, instance: str, step: str) -> str | None:
        row = self._final_rows.get((instance, step))
        return None if row is None else str(row["state"])

    # -- questions checkers, scenarios and commands ask -------------------------------------------
    def store_events(self, instance: Any = None, step: Any = None, *kinds: str) -> list[Event]:
        """The store's events about ``instance`` and ``step`` (either or both; all when neither is
        given), of the given kinds (all when none), in history order."""
        if instance is None and step is None:
            events: Iterable[Event] = self._by_process.get(v.STORE, ())
        elif instance is not None and step is not None:
            events = self._store_by_step.get((instance, step), ())
        else:
            events = [e for e in self._by_process.get(v.STORE, ())
                      if (instance is None or e.data.get("instance") == instance)
                      and (step is None or e.data.get("step") == step)]
        return [e for e in events if e.kind in kinds] if kinds else list(events)

    def requests(self, *, key: str | None = None, instance: str | None = None,
                 step: str | None = None) -> list[Event]:
        """The downstream ledger's rows (every request, applied or not), by the key it carried or
        by the step it was made for (the ``meta`` the worker sent)."""
        rows = [e for e in self._by_process.get(v.DOWNSTREAM, ()) if e.kind == v.REQUEST]
        if key is None and instance is None and step is None:
            return rows
        return [e for e in rows if (key is None or e.data.get("key") == key)
                and (instance is None or e.meta.get("instance") == instance)
                and (step is None or e.meta.get("step") == step)]

    def applied(self, *, key: str | None = None, instance: str | None = None,
                step: str | None = None) -> list[Event]:
        """The requests where a new effect really happened (``dropped`` included: applied, no answer)."""
        return [e for e in self.requests(key=key, instance=instance, step=step)
                if e.data.get("applied") is True]

    def worker_events(self, kind: str | None = None, *, process: str | None = None,
                      type: str | None = None, instance: str | None = None,
                      step: str | None = None) -> list[Event]:
        """Events of worker incarnations, narrowed by kind, incarnation, type, instance and step."""
        return [e for e in self._worker_events if (kind is None or e.kind == kind)
                and (process is None or e.process == process) and (type is None or e.type == type)
                and (instance is None or e.data.get("instance") == instance)
                and (step is None or e.data.get("step") == step)]

    def harness_events(self, kind: str | None = None, *, worker: str | None = None) -> list[Event]:
        """What the harness did (spawn, kill, stop, cont, exit...), narrowed by kind and worker."""
        return [e for e in self._by_process.get(v.HARNESS, ()) if (kind is None or e.kind == kind)
                and (worker is None or e.data.get("worker") == worker)]

    def fired(self) -> list[Event]:
        """The failpoint hits where an action fired (a hit that did nothing is left out)."""
        return [e for e in self.worker_events(v.POINT) if e.data.get("action")]

    def fired_steps(self) -> set[tuple[Any, Any]]:
        """The (instance, step) pairs a fault fired on: what a narration of the run follows."""
        return {(e.data.get("instance"), e.data.get("step")) for e in self.fired()}

    # Indexes built on first use, so that every lookup above is O(1) and a checker stays linear in
    # the history (a frozen dataclass still lets cached_property fill its instance dictionary).
    # The first entry wins, as the linear scans they replace did.
    @cached_property
    def _by_process(self) -> dict[str, list[Event]]:
        index: dict[str, list[Event]] = {}
        for e in self.events:
            index.setdefault(e.process, []).append(e)
        return index

    @cached_property
    def _worker_events(self) -> list[Event]:
        return [e for e in self.events if e.process not in NON_WORKERS]

    @cached_property
    def _store_by_step(self) -> dict[tuple[Any, Any], list[Event]]:
        index: dict[tuple[Any, Any], list[Event]] = {}
        for e in self._by_process.get("store", ()):
            data = e.data
            sid = (data.get("instance"), data.get("step"))
            group = index.get(sid)
            if group is None:
                index[sid] = [e]
            else:
                group.append(e)
        return index

    @cached_property
    def _parsed(self) -> tuple[dict[type, list[TypedEvent]], tuple[InvalidEvent, ...]]:
        """The typed events by family (each under its class, the families above it and object),
        and what is wrong with each event that could not be typed."""
        families: dict[type, list[TypedEvent]] = {}
        invalid: list[InvalidEvent] = []
        for e in self.events:
            try:
                t = e.typed
            except InvalidEvent as exc:
                invalid.append(exc)
                continue
            for cls in type(t).__mro__:
                families.setdefault(cls, []).append(t)
        return families, tuple(invalid)

    @cached_property
    def _typed_store_by_step(self) -> dict[tuple[Any, Any], list[StoreEvent]]:
        index: dict[tuple[Any, Any], list[StoreEvent]] = {}
        for e in self.typed(StoreEvent):
            index.setdefault((e.instance, e.step), []).append(e)
        return index

    @cached_property
    def _effects(self) -> list[Request]:
        return [r for r in self.typed(Request) if r.applied]

    @cached_property
    def _step_configs(self) -> dict[tuple[str, str], StepConfig]:
        index: dict[tuple[str, str], StepConfig] = {}
        for s in self.steps:
            index.setdefault((s.instance, s.step), s)
        return index

    @cached_property
    def _checkpoints(self) -> dict[str, Mapping[str, Any]]:
        index: dict[str, Mapping[str, Any]] = {}
        for row in self.checkpoints:
            index.setdefault(row["instance"], row)
        return index

    @cached_property
    def _final_rows(self) -> dict[tuple[str, str], Mapping[str, Any]]:
        index: dict[tuple[str, str], Mapping[str, Any]] = {}
        for row in self.final:
            index.setdefault((row["instance"], row["step"]), row)
        return index


def build(raw: Iterable[tuple[int, str, str, str, Mapping[str, Any]]], **meta: Any) -> History:
    """Make a history from (time, process, kind, type, data) tuples, ordered by time.

    Handy for hand-written histories in tests: indexes are assigned in time order.
    """
    ordered = sorted(raw, key=lambda r: r[0])
    return History(tuple(Event(i, t, p, k, ty, dict(d)) for i, (t, p, k, ty, d) in enumerate(ordered)),
                   **meta)


def read_journal(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a worker journal: JSON lines, a torn last line (the worker was killed mid-write) tolerated."""
    with open(path, "rb") as fh:
        text = fh.read().decode("utf-8", errors="replace")
    head, _, tail = text.rpartition("\n")  # tail: a last line without its newline, torn or whole
    try:  # one parse for every complete line; line by line only when one is off (or blank)
        entries: list[dict[str, Any]] = json.loads("[" + head.replace("\n", ",") + "]") if head else []
    except ValueError:
        entries = [json.loads(line) for line in head.split("\n") if line.strip()]
    if tail.strip():
        try:
            entries.append(json.loads(tail))
        except ValueError:
            pass  # the write the kill interrupted
    return entries


def merge(journals: Mapping[str, list[dict[str, Any]]], store_events: Iterable[Mapping[str, Any]],
          ledger: Iterable[Mapping[str, Any]], harness: Iterable[Mapping[str, Any]],
          dead: Iterable[str] = (), at: "Callable[[int], int] | None" = None, **meta: Any) -> History:
    """Merge the four sources into one history.

    Journal entries are ``{"t": ns, "kind": ..., "type": ..., "op": id, ...data}``; an op's
    invoke and completion share ``op``. Every invoke of a worker in ``dead`` that has no
    completion gets an ``info`` completion at the worker's death (its last harness ``exit``).
    ``at`` turns each CLOCK_MONOTONIC reading into the run's time (the run clock's offset then in
    force, see :mod:`harness.clock`); it never changes their order.
    """
    return drained(merging(journals, store_events, ledger, harness, dead=dead, at=at, **meta))


_T = TypeVar("_T")


def drained(pieces: Generator[None, None, _T]) -> _T:
    """What a made-a-piece-at-a-time generator (:func:`merging`, ``checking``, ``judging``)
    returns, run to its end at once."""
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return cast(_T, done.value)


_PIECE = 400  # events per piece of merging (about a quarter of a millisecond)
_PARSE_PIECE = 400  # events per piece of parsing (about a millisecond)


def merging(journals: Mapping[str, list[dict[str, Any]]], store_events: Iterable[Mapping[str, Any]],
            ledger: Iterable[Mapping[str, Any]], harness: Iterable[Mapping[str, Any]],
            dead: Iterable[str] = (), at: "Callable[[int], int] | None" = None,
            **meta: Any) -> Generator[None, None, History]:
    """:func:`merge` a piece at a time: it yields every few hundred events and returns the history
    (a harness with workers to answer looks at them in between)."""
    raw: list[tuple[int, str, str, str, dict[str, Any]]] = []
    harness = list(harness)
    death = {h["worker"]: h["t"] for h in harness if h.get("kind") == v.EXIT}
    dead = set(dead)
    for worker, entries in journals.items():
        open_ops: dict[Any, dict[str, Any]] = {}
        for e in entries:
            data = dict(e)
            del data["t"], data["kind"], data["type"]
            raw.append((e["t"], worker, e["kind"], e["type"], data))
            if e["type"] == v.INVOKE:
                open_ops[e.get("op")] = e
            elif e["type"] in v.COMPLETIONS:
                open_ops.pop(e.get("op"), None)
        if worker in dead:
            end = death.get(worker, max((e["t"] for e in entries), default=0) + 1)
            for e in open_ops.values():
                data = {k: x for k, x in e.items() if k not in ("t", "kind", "type")}
                data["indeterminate"] = True
                raw.append((end, worker, e["kind"], v.INFO, data))
        yield
    for s in store_events:
        data = {k: x for k, x in s.items() if k not in ("t", "kind")}
        raw.append((s["t"], v.STORE, s["kind"], v.EVENT, data))
    for row in ledger:
        data = {k: x for k, x in row.items() if k not in ("t",)}
        raw.append((row["t"], v.DOWNSTREAM, v.REQUEST, v.EVENT, data))
    for h in harness:
        data = {k: x for k, x in h.items() if k not in ("t", "kind")}
        raw.append((h["t"], v.HARNESS, h["kind"], v.EVENT, data))
    yield
    if at is not None:
        raw = [(at(t), p, k, ty, d) for t, p, k, ty, d in raw]
    raw.sort(key=lambda r: r[0])
    yield
    # The data dicts were made here: no copy of each, as build() makes for a caller's.
    events: list[Event] = []
    for start in range(0, len(raw), _PIECE):
        events.extend(Event(i, t, p, k, ty, d)
                      for i, (t, p, k, ty, d) in enumerate(raw[start:start + _PIECE], start))
        yield
    return History(tuple(events), **meta)
