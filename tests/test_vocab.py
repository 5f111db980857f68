"""One vocabulary, one describer: what writers write is what readers read, and an event is said one way.

Hand-written histories, plus one real run whose every event kind must be in the vocabulary.
"""

from __future__ import annotations

from typing import Any

import pytest

from killpoint import vocab
from killpoint.harness.history import Event, History, build
from killpoint.harness.narrate import describe, line, narrate
from killpoint.reports.base import describe as report_describe
from killpoint.reports.timeline import build_timeline

MS = 1_000_000


def ev(t: float, process: str, kind: str, type: str = vocab.EVENT, **data: Any):
    return (int(t * MS), process, kind, type, data)


def lost_lease_history() -> History:
    """A claims fence 1, is frozen past its lease, B claims fence 2, A's heartbeat then finds the
    lease gone: the worker writes ``heartbeat_lost`` (the kind the report once missed)."""
    return build([
        ev(0, vocab.STORE, vocab.CLAIMED, instance="o", step="s", worker="A", fence=1, lease_version=1,
           attempt=1, from_state="pending", to_state="running"),
        ev(0, "A", vocab.CLAIM, vocab.OK, op=1, instance="o", step="s", fence=1),
        ev(1, "A", vocab.POINT, point="after_call", instance="o", step="s", hit=1, action="pause"),
        ev(2, vocab.HARNESS, vocab.STOP, worker="A", pid=7, signal="SIGSTOP"),
        ev(5, vocab.STORE, vocab.CLAIMED, instance="o", step="s", worker="B", fence=2, lease_version=2,
           attempt=2, from_state="running", to_state="running"),
        ev(6, vocab.HARNESS, vocab.CONT, worker="A", pid=7, signal="SIGCONT", reason="B claimed"),
        ev(7, "A", vocab.HEARTBEAT_LOST, instance="o", step="s", fence=1),
        ev(8, vocab.DOWNSTREAM, vocab.REQUEST, resource="payment", key="o:s", fence=2, status=200,
           outcome=vocab.APPLIED, applied=True, meta={"instance": "o", "step": "s", "worker": "B"}),
        ev(9, vocab.STORE, vocab.COMMITTED, instance="o", step="s", worker="B", fence=2, lease_version=2,
           from_state="running", to_state="succeeded", state_version=4),
    ])


def test_the_report_shows_the_heartbeat_lost_event_the_worker_writes():
    h = lost_lease_history()
    (lost,) = [e for e in h.events if e.kind == vocab.HEARTBEAT_LOST]
    t = build_timeline(h)
    (item,) = [i for i in t.in_lane("A") if i.kind == vocab.HEARTBEAT_LOST]
    assert item.index == lost.index and item.status == "info"
    assert "heartbeat found the lease on o:s gone (fence 1)" == item.label
    assert line(lost) == "A: heartbeat found the lease on o:s gone (fence 1)"


def test_narration_and_report_say_each_event_in_the_same_words():
    h = lost_lease_history()
    told = narrate(h, [("o", "s")])
    items = {i.index: i for i in build_timeline(h).items}
    assert len(told) >= 6
    for e in h.events:
        said = describe(e)
        assert said and said != e.kind, e
        assert report_describe(e) == f"e{e.index} {e.process} {said}"
        if e.index in items and e.kind not in vocab.OP_KINDS:  # operations are drawn invoke to completion
            assert items[e.index].label == said
        text = line(e)
        if text is not None:
            assert text == f"{e.process}: {said}"
            assert any(t.endswith(text) for t in told), text


@pytest.mark.parametrize("event, words", [
    (Event(0, 0, vocab.STORE, vocab.COMMIT_REJECTED, vocab.EVENT,
           {"worker": "A", "fence": 1, "lease_version": 2, "state_version": 3, "expected_state_version": 2}),
     "REFUSED A's commit with fence 1: the lease is at fence 2, state version 3 (expected 2)"),
    (Event(0, 0, vocab.HARNESS, vocab.EXIT, vocab.EVENT, {"worker": "A", "pid": 9, "signal": "SIGKILL"}),
     "worker A (pid 9) ended, killed by SIGKILL"),
    (Event(0, 0, vocab.HARNESS, vocab.SPAWN, vocab.EVENT, {"worker": "A.2", "identity": "A", "pid": 9}),
     "started worker A.2 as pid 9 (same identity)"),
    (Event(0, 0, "A", vocab.POINT, vocab.EVENT, {"point": "after_call", "step": "s", "hit": 2, "action": None}),
     "passed s.after_call (hit 2; nothing fired)"),
    (Event(0, 0, "A", vocab.CALL, vocab.INFO, {"indeterminate": True}), "call outcome unknown (it died first)"),
    (Event(0, 0, "A", vocab.COMMIT, vocab.FAIL, {"instance": "o", "step": "s"}), "commit o:s certainly not done"),
    (Event(0, 0, "A", vocab.STORE_UNAVAILABLE, vocab.EVENT, {"error": "gone", "outcome_unknown": True}),
     "store connection lost (outcome unknown): gone"),
    (Event(0, 0, vocab.DOWNSTREAM, vocab.REQUEST, vocab.EVENT,
           {"resource": "payment", "key": None, "status": 200, "outcome": vocab.APPLIED, "applied": True,
            "meta": {"worker": "B"}}),
     "B -> payment key (no key: legacy): 200 applied (a new effect)"),
    (Event(0, 0, vocab.STORE, vocab.CLAIMED, vocab.EVENT,  # a target's records that name no worker
           {"instance": "o", "step": "s", "worker": None, "attempt": 2, "from_state": "retry_scheduled",
            "to_state": "running"}),
     "a worker claimed o:s (attempt 2, retry_scheduled -> running)"),
    (Event(0, 0, vocab.STORE, vocab.COMMITTED, vocab.EVENT,
           {"instance": "o", "step": "s", "worker": None, "from_state": "running", "to_state": "succeeded",
            "state_version": 5}),
     "accepted a commit: o:s running -> succeeded (state version 5)"),
])
def test_describe_says_what_an_event_means(event, words):
    assert describe(event) == words


def test_history_answers_the_questions_checkers_scenarios_and_commands_ask():
    h = lost_lease_history()
    assert [e.get("worker") for e in h.store_events("o", "s", vocab.CLAIMED)] == ["A", "B"]
    assert [e.kind for e in h.store_events(step="s")] == [vocab.CLAIMED, vocab.CLAIMED, vocab.COMMITTED]
    assert h.store_events("other", "s") == []
    (req,) = h.requests(instance="o", step="s")
    assert h.requests(key="o:s") == [req] and h.requests(key="nope") == []
    assert h.applied(instance="o") == [req] and req.meta["worker"] == "B"
    assert [e.kind for e in h.worker_events(process="A")] == [vocab.CLAIM, vocab.POINT, vocab.HEARTBEAT_LOST]
    assert [e.type for e in h.worker_events(vocab.CLAIM, type=vocab.OK)] == [vocab.OK]
    assert [e.kind for e in h.harness_events(worker="A")] == [vocab.STOP, vocab.CONT]
    assert h.harness_events(vocab.KILL) == []
    assert h.fired_steps() == {("o", "s")} and [e.get("action") for e in h.fired()] == ["pause"]


def test_every_event_kind_a_real_run_writes_is_in_the_vocabulary():
    from killpoint import RunConfig, Session, parse_schedule

    known = {value for name, value in vars(vocab).items() if name.isupper() and isinstance(value, str)}
    with Session() as session:
        result = session.run(RunConfig(schedule=parse_schedule("A@charge.after_call:1*pause")))
    h = result.history
    kinds = {e.kind for e in h.events}
    assert kinds <= known, kinds - known
    assert {e.type for e in h.events} <= {vocab.INVOKE, *vocab.COMPLETIONS, vocab.EVENT}
    assert {e.process for e in h.events if not e.is_worker} == vocab.NON_WORKERS
    assert {vocab.CLAIMED, vocab.COMMIT_REJECTED, vocab.SPAWN, vocab.POINT} <= kinds  # the takeover happened


@pytest.mark.parametrize("kind", sorted(vocab.STORE_KINDS))
def test_a_store_event_from_a_sparse_history_hook_is_described_without_none(kind):
    """Protects the narration of a target's own history() events, which often lack fields killpoint's
    store writes (a refused ack with no lease_version, a claim with no attempt): a field is said or
    left out, never printed as "None" ("fence None, state version None (expected None)" once)."""
    sparse = build([ev(1, vocab.STORE, kind, instance="job-1", step="charge", worker="A", fence=1)])
    (e,) = sparse.events
    said = describe(e)
    assert "None" not in said and "job-1:charge" in said


def test_recovery_evidence_and_a_bare_ledger_row_are_described_without_none():
    """Protects the recovery line ("receipt None, retry-safe True" once) and a ledger row sent with
    no worker, fence or intent."""
    h = build([ev(1, "B", vocab.RECOVER, instance="o", step="s", receipt=None, retry_safe=False, attempts=1,
                  max_attempts=3, action="manual_review"),
               ev(2, vocab.DOWNSTREAM, vocab.REQUEST, resource="notify", key=None, status=200,
                  outcome=vocab.APPLIED, applied=True, meta={})])
    recover, request = (describe(e) for e in h.events)
    assert recover == "recovery evidence: no receipt, not retry-safe, 1/3 attempts -> manual_review"
    assert "None" not in request and "(no key: legacy)" in request
