"""What a task queue records of each job's life, as killpoint's store events: RQ's record.

Pure functions, no library and no I/O: the ``rq:*`` targets' ``history()`` hook (the built-in ones
and a user's own jobs, ``rq:PKG.MODULE:NAME``) reads RQ's record of each step's job from Redis and
maps it here; the tests map hand-written records. Every event stands for one entry of RQ's record,
and a fact RQ does not record is left out, never made up. ``final_states()`` comes from the same
events (:func:`final_states_of`), so the two never disagree.

**What RQ keeps** (RQ 2+). Per job: its hash (``created_at``, ``status``, and the fields of
whichever execution wrote it last: a frozen execution's late success writes back its own
``started_at``, ``worker_name`` and ``retries_left``), a stream of results (``rq:results:<job>``:
one entry per outcome a worker or RQ's maintenance recorded, each with its type and the worker's
name and, since RQ 2, the execution's id, start and end; the last 10 are kept) and a registry of
its open executions (``rq:executions:<job>``). An execution that ended through the worker is
deleted from the registry, its result kept; one abandoned (its worker killed, or frozen past the
heartbeat) keeps its id in the registry for 60 s past its last heartbeat, its hash gone with the
heartbeat (its worker and start with it), and has no result; one that failed and was retried
leaves nothing.

=======================================  ===========  ==========================================
RQ records                               event        from -> to
=======================================  ===========  ==========================================
the job hash's ``created_at``            created      -> pending
an execution's start (a result's         claimed      (the step's state then) -> running;
``execution_started_at``, or an open                  ``worker`` from the worker's name
execution's hash)
a result: SUCCESSFUL                     committed    (its execution's state) -> succeeded
FAILED, STOPPED, MAX_RETRIES_EXCEEDED    committed    -> failed
RETRIED (the job returned ``Retry``)     committed    -> retry_scheduled
=======================================  ===========  ==========================================

A result names its execution: its ``from_state`` is the state that execution left (its claim's
``running``, or an earlier result of the same execution), so a second outcome of one execution
reads ``succeeded -> succeeded``, which ``legal_transitions`` refuses. A result naming no execution
(RQ's maintenance failing an abandoned job with no retries left, or a result written before RQ 2)
is a write RQ makes only to a job in ``started``: from ``running``. A claim starts from the state
the step is in when it starts: an execution that starts while another is open (a takeover) is
``running -> running``; one that starts after RQ recorded the job's success or final failure (RQ ran
a finished job again) is ``succeeded -> running`` or ``failed -> running``, which
``legal_transitions`` refuses.

RQ keeps no version, no fence and no attempt number: nothing in its record refers to an earlier
outcome or compares one, so ``state_version`` is the order of the record (starts by their times,
results in the stream's order) and ``version_chain`` holds by construction; the events carry no
``fence``, ``lease_version`` or ``attempt``. So a frozen execution's late success, which RQ accepts
after it abandoned that execution and another one succeeded, is a commit ``running -> succeeded``
by its worker after the other's: a stale write RQ does not refuse, which only a fence could show
(``stale_writes_rejected``'s store half has nothing to judge), and never a fork or an illegal
transition of a correct target. An execution the registry still holds whose hash has expired has
no start and no worker left: it is not a claim, and its id is kept on the step's last event
(``lapsed_executions``).

Times are RQ's (wall clock, put on ``CLOCK_MONOTONIC`` with ``offset_ns``, the difference
``time.time_ns() - time.monotonic_ns()``); within a step they are kept strictly rising, in the
record's order.

The other queues record too little for such a mapping (docs/howto/task-queues.md, "Which invariants
judge"): Celery's result backend keeps one meta per task (the first success; no start), Dramatiq's
and Huey's result stores the return value alone, arq one result per job that the last try to finish
overwrites.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

from killpoint import vocab
from killpoint.harness import states

__all__ = ["RQ_RESULT_STATES", "final_states_of", "rq_events"]

# RQ's Result.Type values -> (its name, the step's state after it)
RQ_RESULT_STATES = {1: ("SUCCESSFUL", states.SUCCEEDED), 2: ("FAILED", states.FAILED),
                    3: ("STOPPED", states.FAILED), 4: ("RETRIED", states.RETRY_SCHEDULED),
                    5: ("MAX_RETRIES_EXCEEDED", states.FAILED)}


class _Step:
    """One step's rows in the record's order: each +1 on the one before, each step's times rising."""

    def __init__(self, instance: str, step: str, offset_ns: int, source: str) -> None:
        self.instance, self.step, self.offset_ns, self.source = instance, step, offset_ns, source
        self.rows: list[dict[str, Any]] = []
        self.t = 0

    @property
    def state(self) -> str:
        return self.rows[-1]["to_state"] if self.rows else states.PENDING

    def add(self, kind: str, to_state: str, epoch_ns: int, *, from_state: str | None = None,
            **fields: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"kind": kind, "instance": self.instance, "step": self.step}
        if kind != vocab.CREATED:
            row["from_state"] = from_state if from_state is not None else self.state
        row["to_state"] = to_state
        row["state_version"] = len(self.rows) + 1
        t = epoch_ns - self.offset_ns
        if self.rows and t <= self.t:
            t = self.t + 1
        self.t = row["t"] = t
        row["source"] = self.source
        row.update({k: v for k, v in fields.items() if v is not None and v != "" and v != []})
        self.rows.append(row)
        return row


def _ns(epoch_s: float) -> int:
    return int(round(epoch_s * 1_000_000)) * 1000


def _stream_ms(result_id: str) -> int:
    """A Redis stream entry id's time (``1796635447738-0`` -> 1796635447738 ms)."""
    return int(str(result_id).split("-")[0])


def _stream_order(result_id: str) -> tuple[int, int]:
    ms, _, seq = str(result_id).partition("-")
    return int(ms), int(seq or 0)


# -- RQ -------------------------------------------------------------------------------------------


def rq_events(instance: str, step: str, *, created_at: float | None, results: Sequence[Mapping[str, Any]],
              open_executions: Sequence[Mapping[str, Any]] = (), worker_of: Callable[[str], str | None] = lambda w: w,
              offset_ns: int, enqueued_at: float | None = None) -> list[dict[str, Any]]:
    """Store events from one RQ job's record (the module's docstring says how).

    ``created_at`` (epoch seconds) is the job hash's; ``results`` the entries of its results stream,
    each a mapping with ``id`` (the stream id), ``type`` (RQ's ``Result.Type`` value), ``worker``
    (the worker's name, empty for RQ's maintenance) and, since RQ 2, ``execution`` (its id),
    ``started`` and ``ended`` (epoch seconds); ``open_executions`` the executions the job's registry
    still holds that no result names (``id``, and ``worker`` and ``started`` while the execution's
    hash lives). ``worker_of`` turns a worker's name into a killpoint worker id. A result of a type
    this mapping does not know is an error: it would have to guess the state it leaves."""
    chain = _Step(instance, step, offset_ns, "rq")
    if created_at is not None:
        chain.add(vocab.CREATED, states.PENDING, _ns(created_at), event="job created_at",
                  enqueued_at=enqueued_at)
    # the moves: each execution's start (by its time), each result (in the stream's order)
    starts: dict[str, tuple[int, str | None]] = {}  # execution id -> (start, its worker's name)
    lapsed: list[str] = []
    ordered = sorted(results, key=lambda r: _stream_order(r["id"]))
    for r in ordered:
        if r.get("execution") and r.get("started") is not None:
            starts.setdefault(str(r["execution"]), (_ns(float(r["started"])), r.get("worker") or None))
    for e in open_executions:
        if e.get("started") is None:
            lapsed.append(str(e["id"]))
        else:
            starts.setdefault(str(e["id"]), (_ns(float(e["started"])), e.get("worker") or None))
    claims = sorted(starts.items(), key=lambda item: item[1][0])
    left: dict[str, dict[str, Any]] = {}  # execution id -> the last row it wrote
    n = 0
    for r in ordered:
        kind = int(r["type"])
        if kind not in RQ_RESULT_STATES:
            raise ValueError(f"rq results of {instance}/{step}: entry {r['id']} has type {kind}, which this "
                             f"mapping does not know")
        name, to_state = RQ_RESULT_STATES[kind]
        ended = _ns(float(r["ended"])) if r.get("ended") is not None else _stream_ms(r["id"]) * 1_000_000
        execution = str(r["execution"]) if r.get("execution") else None
        # every execution that started before this result was recorded (its own among them), then it
        while n < len(claims) and (claims[n][1][0] <= ended or (execution in starts and execution not in left)):
            eid, (at, worker) = claims[n]
            left[eid] = chain.add(vocab.CLAIMED, states.RUNNING, at, worker=_worker(worker, worker_of),
                                  event="execution started", execution_id=eid)
            n += 1
        mine = left.get(execution) if execution else None
        left_by = mine["to_state"] if mine is not None else states.RUNNING
        row = chain.add(vocab.COMMITTED, to_state, ended, from_state=left_by,
                        worker=_worker(r.get("worker") or None, worker_of), event=f"result {name}",
                        result_id=str(r["id"]), execution_id=execution)
        if execution:
            left[execution] = row
    for eid, (at, worker) in claims[n:]:  # still open when the record was read
        chain.add(vocab.CLAIMED, states.RUNNING, at, worker=_worker(worker, worker_of),
                  event="execution started (open)", execution_id=eid)
    if lapsed and chain.rows:
        chain.rows[-1]["lapsed_executions"] = lapsed
    return chain.rows


def _worker(name: str | None, worker_of: Callable[[str], str | None]) -> str | None:
    return worker_of(name) if name else None


# -- final states ---------------------------------------------------------------------------------


def final_states_of(rows: Iterable[Mapping[str, Any]], keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Each step's final state: where its last event left it (``pending`` where it has none), so
    that ``final_states()`` and ``history()`` never disagree."""
    last: dict[tuple[str, str], str] = {}
    for r in sorted(rows, key=lambda r: r["t"]):
        last[(r["instance"], r["step"])] = r["to_state"]
    return {k: last.get(k, states.PENDING) for k in keys}
