"""What a Temporal or a Restate server records of each step, as killpoint's store events.

Pure functions, no SDK and no I/O: the ``temporal:*`` and ``restate:*`` targets' ``history()`` hooks
fetch the server's own record (Temporal's workflow execution history, Restate's journal) and map it
here; the tests map hand-written records. Every event they give stands for one entry of the server's
record, and a fact the server does not record is left out, never made up.

**Temporal** (:func:`temporal_events`). Per workflow (an order), its activity events in event-id
order; an activity is a step (its activity id is the step's name; ``step/compensate`` is that step's
compensation):

=============================  ===========  =============================================
Temporal records               event        from -> to
=============================  ===========  =============================================
ActivityTaskScheduled          created      -> pending
  (a compensation's)           committed    (the step's state) -> compensating
ActivityTaskStarted            claimed      pending -> running (compensating -> compensating);
                                            ``attempt``, ``worker`` from the identity
ActivityTaskCompleted          committed    running -> succeeded (compensating -> compensated)
ActivityTaskFailed / TimedOut  committed    running -> failed (a compensation: compensating -> failed)
ActivityTaskCanceled           committed    -> cancelled
the workflow closed            committed    pending -> cancelled, for each step it left pending
=============================  ===========  =============================================

Temporal writes an attempt's ``ActivityTaskStarted`` only with that attempt's outcome, and only
for the last attempt: the attempts before it are in the history as the start's ``attempt`` number
and its ``last_failure`` alone (kept here as ``retried_after``), with no worker and no time. So
each step has one claim, and the lease invariants have nothing to compare: the server does fence a
stale attempt (a completion whose task token carries another attempt is refused), but it records
neither that attempt's start nor the refused completion, so no fence is given (``lease_version``,
``fence``) rather than a fence that could never be seen refused. A workflow still running when the
history is read adds its in-flight attempts from the server's pending activities (``claimed``, with
the attempt, the worker and the start time the server keeps).

**Restate** (:func:`restate_events`). Per invocation (an order), its journal in index order:

=============================  ===========  =============================================
Restate journals               event        from -> to
=============================  ===========  =============================================
Command: Input                 created      -> pending, for each step of the order's input
Command: Run (its name)        claimed      pending -> running
Notification: Run (Success)    committed    running -> succeeded
Notification: Run (Failure)    committed    running -> failed
Command: Output                committed    pending -> cancelled, for each step never run
=============================  ===========  =============================================

Restate records no worker (every worker serves one deployment) and no attempt per step: the
invocation's transient failures are journal events (``TransientError``) that say after which entry
an attempt failed, and a repeat of the same error is not recorded again. Those that fell while a
step was open (its ``Run`` journaled, its result not) are counted on that step's outcome
(``transient_errors``, ``last_error``), as a fact about the step, never as claims of attempts the
journal does not show. The server learns that a step began only when the SDK sends its ``Run``
command, which may come after the closure already ran in an attempt that died: such a run leaves no
trace in the journal (the downstream's ledger still has its request).

**Versions.** Neither server keeps a version per step, but both keep references: a Temporal start
names its scheduled event, an outcome its start; a Restate notification names its ``Run`` by
completion id, and a ``Run`` follows the invocation's input. An event's ``state_version`` is the
version of the event it refers to, plus one, and its ``from_state`` the state that event left; so
``version_chain`` reads the server's own references: two starts of one scheduled task, or two
outcomes of one start, are a fork, and an outcome whose start is not in the history is a gap. An
event that refers to nothing (a compensation scheduled, a step settled by the workflow's end)
follows the step's chain. ``legal_transitions`` judges the server's path against killpoint's table,
where the two can differ (a compensation that failed for good ends ``failed``, which the table
refuses: killpoint expects manual review there).

Times are the server's (wall clock, put on ``CLOCK_MONOTONIC`` with ``offset_ns``, the difference
``time.time_ns() - time.monotonic_ns()``); within a step they are kept strictly rising, in the
record's order.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from killpoint import vocab
from killpoint.harness import states

__all__ = ["COMPENSATE", "final_states_of", "restate_events", "temporal_events", "worker_of"]

COMPENSATE = "/compensate"  # the activity id suffix of a step's compensation (temporal_orders)
_IDENTITY = re.compile(r"^killpoint-(.+)-\d+$")  # what temporal_server gives each worker's client


def worker_of(identity: str | None) -> str | None:
    """The killpoint worker id in a Temporal worker identity (``killpoint-A-1234`` -> ``A``); any
    other identity as it is (a worker killpoint did not start); None when there is none."""
    if not identity:
        return None
    found = _IDENTITY.match(identity)
    return found.group(1) if found else identity


class _Steps:
    """The events mapped so far, step by step: each event's row is kept so that a later event can
    refer to it (its version and the state it left), and each step's times rise strictly."""

    def __init__(self, instance: str, offset_ns: int, source: str) -> None:
        self.instance = instance
        self.offset_ns = offset_ns
        self.source = source
        self.rows: list[dict[str, Any]] = []
        self.last: dict[str, dict[str, Any]] = {}  # step -> its latest row
        self.t: dict[str, int] = {}

    def add(self, step: str, kind: str, to_state: str, epoch_ns: int, *, after: Mapping[str, Any] | None = None,
            missing: str | None = None, **fields: Any) -> dict[str, Any]:
        """A row for ``step``: after the row ``after`` (its version + 1, from the state it left);
        with ``missing`` (the state the event it refers to would have left), after an event the
        record does not have (a gap of one version); else after the step's latest row. ``created``
        starts a chain at version 1."""
        last = self.last.get(step)
        row: dict[str, Any] = {"kind": kind, "instance": self.instance, "step": step}
        if kind == vocab.CREATED:
            row["state_version"] = 1
        elif after is not None:
            row["from_state"], row["state_version"] = after["to_state"], after["state_version"] + 1
        elif missing is not None:
            row["from_state"], row["state_version"] = missing, (last["state_version"] if last else 0) + 2
        elif last is not None:
            row["from_state"], row["state_version"] = last["to_state"], last["state_version"] + 1
        else:  # the step's first event refers to nothing: it was pending (the order's input named it)
            row["from_state"], row["state_version"] = states.PENDING, 1
        row["to_state"] = to_state
        t = epoch_ns - self.offset_ns
        if step in self.t and t <= self.t[step]:
            t = self.t[step] + 1
        self.t[step] = row["t"] = t
        row["source"] = self.source
        row.update({k: v for k, v in fields.items() if v is not None and v != ""})
        self.rows.append(row)
        self.last[step] = row
        return row

    def settle_pending(self, steps: Iterable[str], epoch_ns: int, why: str) -> None:
        """The instance ended: each step it left pending (or never began) is cancelled."""
        for step in steps:
            last = self.last.get(step)
            if last is None or last["to_state"] == states.PENDING:
                self.add(step, vocab.COMMITTED, states.CANCELLED, epoch_ns, event=why)


# -- Temporal -------------------------------------------------------------------------------------

# A Temporal activity's outcome -> (the step's state after it, the compensation's)
_OUTCOMES = {"completed": (states.SUCCEEDED, states.COMPENSATED), "failed": (states.FAILED, states.FAILED),
             "timed_out": (states.FAILED, states.FAILED), "canceled": (states.CANCELLED, states.CANCELLED)}
_TEMPORAL_NAMES = {"scheduled": "ActivityTaskScheduled", "started": "ActivityTaskStarted",
                   "completed": "ActivityTaskCompleted", "failed": "ActivityTaskFailed",
                   "timed_out": "ActivityTaskTimedOut", "canceled": "ActivityTaskCanceled"}


def _activity(activity_id: str) -> tuple[str, bool]:
    """(the step, whether this is its compensation) an activity id names."""
    if activity_id.endswith(COMPENSATE):
        return activity_id[:-len(COMPENSATE)], True
    return activity_id, False


def temporal_events(instance: str, events: Sequence[Mapping[str, Any]], *, steps: Sequence[str],
                    offset_ns: int, pending: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Store events from one workflow's history (the module's docstring says how).

    ``events`` are its activity and closing events in event-id order, each a mapping with
    ``event`` (``scheduled``, ``started``, ``completed``, ``failed``, ``timed_out``, ``canceled``,
    or ``closed``), ``id`` (the event id), ``t`` (epoch nanoseconds) and what the event carries:
    ``activity_id`` (scheduled), ``scheduled`` and ``started`` (the ids it refers to), ``attempt``,
    ``identity``, ``failure`` (a message), ``how`` (closed: completed, failed, ...). ``pending`` are
    the workflow's in-flight attempts while it still runs (``activity_id``, ``attempt``,
    ``identity``, ``t``: when the attempt started). ``steps`` are the order's steps, which the
    workflow's end settles when it left them pending. An event of another kind is an error."""
    chains = _Steps(instance, offset_ns, "temporal")
    by_id: dict[int, dict[str, Any]] = {}  # event id -> its row
    compensation: dict[int, bool] = {}  # scheduled event id -> whether it is a compensation
    activity_of: dict[int, str] = {}  # scheduled event id -> its step
    open_scheduled: dict[str, dict[str, Any]] = {}  # activity id -> its latest scheduled row
    for e in events:
        what, eid = e["event"], int(e["id"])
        common = {"event": _TEMPORAL_NAMES.get(what, what), "event_id": eid}
        if what == "scheduled":
            step, comp = _activity(str(e["activity_id"]))
            compensation[eid], activity_of[eid] = comp, step
            if comp:
                row = chains.add(step, vocab.COMMITTED, states.COMPENSATING, e["t"],
                                 activity_id=e["activity_id"], **common)
            else:
                row = chains.add(step, vocab.CREATED, states.PENDING, e["t"], activity_id=e["activity_id"],
                                 **common)
            by_id[eid] = open_scheduled[str(e["activity_id"])] = row
        elif what == "started":
            sid = int(e["scheduled"])
            of_step, comp = activity_of.get(sid), compensation.get(sid, False)
            if of_step is None:
                raise ValueError(f"temporal history: ActivityTaskStarted {eid} refers to scheduled event "
                                 f"{sid}, which the history does not have")
            by_id[eid] = chains.add(of_step, vocab.CLAIMED, states.COMPENSATING if comp else states.RUNNING, e["t"],
                                    after=by_id[sid], worker=worker_of(e.get("identity")),
                                    attempt=e.get("attempt"), identity=e.get("identity"),
                                    retried_after=e.get("failure"), **common)
        elif what in _OUTCOMES:
            sid, started = int(e["scheduled"]), int(e.get("started") or 0)
            of_step, comp = activity_of.get(sid), compensation.get(sid, False)
            if of_step is None:
                raise ValueError(f"temporal history: {common['event']} {eid} refers to scheduled event "
                                 f"{sid}, which the history does not have")
            to_state = _OUTCOMES[what][1 if comp else 0]
            before = states.COMPENSATING if comp else states.RUNNING
            ref = by_id.get(started) if started else by_id[sid]
            fields = {"worker": worker_of(e.get("identity")), "identity": e.get("identity"),
                      "failure": e.get("failure"), **common}
            if ref is None:  # its start is not in the history: a gap of one version
                by_id[eid] = chains.add(of_step, vocab.COMMITTED, to_state, e["t"], missing=before, **fields)
            else:
                by_id[eid] = chains.add(of_step, vocab.COMMITTED, to_state, e["t"], after=ref, **fields)
        elif what == "closed":
            how = "".join(word.title() for word in str(e.get("how", "closed")).split("_"))
            chains.settle_pending(steps, e["t"], f"WorkflowExecution{how}")
        else:
            raise ValueError(f"temporal history: event {eid} of kind {what!r} is not one this mapping knows")
    for p in pending:
        waiting = open_scheduled.get(str(p["activity_id"]))
        step, comp = _activity(str(p["activity_id"]))
        if waiting is None or chains.last.get(step) is not waiting:
            continue  # its scheduled event is not in the history read, or the step has moved on since
        chains.add(step, vocab.CLAIMED, states.COMPENSATING if comp else states.RUNNING, p["t"], after=waiting,
                   worker=worker_of(p.get("identity")), attempt=p.get("attempt"), identity=p.get("identity"),
                   event="PendingActivityInfo (the attempt in flight)")
    return chains.rows


# -- Restate --------------------------------------------------------------------------------------


def _epoch_ns(at: Any) -> int:
    """Restate's ``appended_at`` (``2026-12-07T08:53:34.200Z``) in epoch nanoseconds."""
    return int(datetime.fromisoformat(str(at).replace("Z", "+00:00")).timestamp() * 1_000_000) * 1000


def _lite(raw: Any) -> Mapping[str, Any]:
    if isinstance(raw, Mapping):
        return raw
    return json.loads(raw) if raw else {}


def _result(note: Mapping[str, Any]) -> str:
    """A Run notification's result as its kind's name (``Success``, ``Failure``)."""
    result = note.get("result")
    if isinstance(result, Mapping) and len(result) == 1:
        return str(next(iter(result)))
    return str(result)


def restate_events(instance: str, journal: Sequence[Mapping[str, Any]], *, steps: Sequence[str], offset_ns: int,
                   errors: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Store events from one invocation's journal (the module's docstring says how).

    ``journal`` are its entries (``index``, ``lite``: the entry's ``entry_lite_json``, ``at``: its
    ``appended_at``); ``errors`` its journal events (``after``: the index it follows, ``at``,
    ``json``: the ``event_json``). ``steps`` are the steps of the order's input. A Run notification
    whose Run the journal does not have, or whose result is neither a success nor a failure, is an
    error: this mapping would have to guess which step it finished or how."""
    chains = _Steps(instance, offset_ns, "restate")
    entries = sorted(journal, key=lambda j: int(j["index"]))
    runs: dict[Any, dict[str, Any]] = {}  # completion id -> the Run's row
    created: dict[str, dict[str, Any]] = {}
    open_at: list[tuple[int, int | None, str]] = []  # (Run index, its notification's index, step)
    outcome: dict[str, dict[str, Any]] = {}
    last_t = 0
    for j in entries:
        lite, index = _lite(j.get("lite")), int(j["index"])
        t = _epoch_ns(j["at"]) if j.get("at") else last_t + 1
        last_t = t
        command, note = lite.get("Command") or {}, lite.get("Notification") or {}
        if "Input" in command:
            for step in steps:
                created[step] = chains.add(step, vocab.CREATED, states.PENDING, t, event="Command: Input",
                                           journal_index=index)
        elif "Run" in command:
            run = command["Run"]
            step = str(run.get("name"))
            runs[run.get("completion_id")] = chains.add(
                step, vocab.CLAIMED, states.RUNNING, t, after=created.get(step), event="Command: Run",
                journal_index=index, completion_id=run.get("completion_id"))
            open_at.append((index, None, step))
        elif (note.get("ty") or {}).get("Completion") == "Run":
            cid = (note.get("id") or {}).get("CompletionId")
            run_row = runs.get(cid)
            if run_row is None:
                raise ValueError(f"restate journal of {instance}: entry {index} completes Run {cid}, which the "
                                 f"journal does not have")
            result = _result(note)
            if result not in ("Success", "Failure"):
                raise ValueError(f"restate journal of {instance}: entry {index} completes Run {cid} with "
                                 f"{result!r}, neither Success nor Failure")
            step = run_row["step"]
            to_state = states.SUCCEEDED if result == "Success" else states.FAILED
            outcome[step] = chains.add(step, vocab.COMMITTED, to_state, t, after=run_row, event="Notification: Run",
                                       journal_index=index, completion_id=cid)
            open_at = [(i, index if s == step and n is None else n, s) for i, n, s in open_at]
        elif "Output" in command:
            chains.settle_pending(steps, t, "Command: Output")
    for err in errors:  # a transient failure while a step was open: counted on that step
        after = int(err["after"])
        event = _lite(err.get("json"))
        for run_index, done_index, step in open_at:
            if run_index <= after and (done_index is None or after < done_index):
                row = outcome.get(step) or chains.last[step]
                row["transient_errors"] = row.get("transient_errors", 0) + 1
                row["last_error"] = str(event.get("error_message", ""))[:300]
    return chains.rows


# -- both -----------------------------------------------------------------------------------------


def final_states_of(rows: Iterable[Mapping[str, Any]], keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Each step's final state: where its last event left it (``pending`` where it has none), so
    that ``final_states()`` and ``history()`` never disagree."""
    last: dict[tuple[str, str], str] = {}
    for r in sorted(rows, key=lambda r: r["t"]):
        last[(r["instance"], r["step"])] = r["to_state"]
    return {k: last.get(k, states.PENDING) for k in keys}
