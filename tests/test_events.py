"""The typed history's parse boundary (``killpoint.harness.events``): each family's ``Literal`` kinds
are the vocabulary's strings, a well-formed event becomes its family's class with its fields as
attributes, and a bad one is an ``InvalidEvent`` naming the event, its kind and the field.

Hand-written events and hooks called directly: no processes.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest

from killpoint import vocab
from killpoint.errors import InvalidEvent, KillpointError
from killpoint.harness import events as ev
from killpoint.harness.declaration import TargetRun, target
from killpoint.harness.history import Event, build
from killpoint.harness.hooks import Hooks


def one(process: str, kind: str, type: str = vocab.EVENT, **data: Any) -> Event:
    return build([(1, process, kind, type, data)]).events[0]


def _constants(*names: str) -> set[str]:
    return {getattr(vocab, n) for n in names}


def test_each_familys_literal_kinds_are_the_vocabularys_strings():
    """A kind spelt one way in the Literal and another in vocab would make mypy pass a kind no
    writer writes; the Literals and the constants must be the same sets."""
    assert set(get_args(ev.StoreKind)) == vocab.STORE_KINDS
    assert set(get_args(ev.Outcome)) == vocab.OUTCOMES
    assert set(get_args(ev.OpKind)) == vocab.OP_KINDS
    assert set(get_args(ev.OpType)) == {vocab.INVOKE} | vocab.COMPLETIONS
    assert set(get_args(ev.WorkerKind)) == _constants(
        "RECOVER", "CHECKPOINT", "HEARTBEAT_LOST", "STORE_UNAVAILABLE", "START", "FINISH", "RAISED",
        "ACTIVITY", "REPLAYED", "LIBRARY_ERROR", "LEASE_LOST", "SOMETIMES")
    assert set(get_args(ev.HarnessKind)) == vocab.HARNESS_KINDS


def test_every_family_parses_to_its_class_with_its_fields_as_attributes():
    store = one(vocab.STORE, vocab.CLAIMED, instance="o", step="s", worker="A", fence=2,
                lease_version=2, from_state="pending", to_state="running", db_time=1.5).typed
    assert isinstance(store, ev.StoreEvent)
    assert (store.kind, store.instance, store.fence, store.to_state) == ("claimed", "o", 2, "running")
    assert store.accepted and store.extra == {"db_time": 1.5}  # nothing written is lost

    req = one(vocab.DOWNSTREAM, vocab.REQUEST, resource="payment", key=None, fence=3, status=200,
              outcome=vocab.APPLIED, applied=True, meta={"instance": "o", "step": "s", "attempt": 2}).typed
    assert isinstance(req, ev.Request)
    assert (req.outcome, req.applied, req.key, req.meta.instance, req.meta.attempt) == \
        ("applied", True, None, "o", 2)
    assert req.meta.direction is None

    op = one("A.2", vocab.CALL, vocab.INFO, op=4, instance="o", step="s", indeterminate=True).typed
    assert isinstance(op, ev.WorkerOp)
    assert (op.process, op.kind, op.type, op.op, op.indeterminate) == ("A.2", "call", "info", 4, True)

    hit = one("A", vocab.POINT, point="after_call", instance="o", step="s", hit=1, action=None).typed
    assert isinstance(hit, ev.PointHit) and hit.action is None and hit.point == "after_call"

    lost = one("B", vocab.HEARTBEAT_LOST, instance="o", step="s", fence=1).typed
    assert isinstance(lost, ev.WorkerEvent) and lost.kind == "heartbeat_lost" and lost.fence == 1

    kill = one(vocab.HARNESS, vocab.KILL, worker="A", pid=7, signal="SIGKILL", reason="fault").typed
    assert isinstance(kill, ev.HarnessAction)
    assert (kill.kind, kill.worker, kill.pid, kill.signal) == ("kill", "A", 7, "SIGKILL")


def test_a_kind_a_target_journals_for_itself_is_kept_not_refused():
    """``ctx.journal.write(kind, ...)`` is public: a target's own kinds are kept for the report."""
    mine = one("A", "charged_card", amount=3).typed
    assert isinstance(mine, ev.TargetEvent) and mine.kind == "charged_card" and mine.extra == {"amount": 3}


@pytest.mark.parametrize("process, kind, type, data, field, words", [
    (vocab.STORE, "claim", vocab.EVENT, {"instance": "o"}, "kind", "'claim' is not a kind of store event"),
    (vocab.HARNESS, "kil", vocab.EVENT, {}, "kind", "'kil' is not a kind of harness event"),
    (vocab.DOWNSTREAM, vocab.REQUEST, vocab.EVENT, {"outcome": "aplied", "applied": True}, "outcome",
     "outcome is 'aplied'"),
    (vocab.DOWNSTREAM, vocab.REQUEST, vocab.EVENT, {"outcome": "applied"}, "applied", "has no applied"),
    (vocab.STORE, vocab.CLAIMED, vocab.EVENT, {"fence": "3"}, "fence", "fence is '3' (str); it must be int"),
    (vocab.STORE, vocab.CLAIMED, vocab.EVENT, {"fence": True}, "fence", "fence is 'True' (bool)"),
    (vocab.DOWNSTREAM, vocab.REQUEST, vocab.EVENT, {"outcome": "applied", "applied": True,
                                                    "meta": {"instance": 7}}, "instance", "instance is '7'"),
    ("A", vocab.CLAIM, vocab.EVENT, {}, "type", "a claim is an operation"),
    ("A", vocab.POINT, "event", {"instance": "o"}, "point", "has no point"),
    ("A", "x", "okay", {}, "type", "'okay' is not an event type"),
])
def test_a_bad_event_is_an_invalid_event_naming_its_kind_and_field(process, kind, type, data, field, words):
    bad = one(process, kind, type, **data)
    with pytest.raises(InvalidEvent) as caught:
        _ = bad.typed
    assert caught.value.field == field and caught.value.kind == kind and caught.value.index == 0
    assert f"event 0 ({process}, kind '{kind}')" in str(caught.value) and words in str(caught.value)
    assert isinstance(caught.value, KillpointError) and isinstance(caught.value, ValueError)


def test_the_typed_form_is_parsed_once_per_event():
    e = one(vocab.STORE, vocab.CREATED, instance="o", step="s")
    assert e.typed is e.typed


def _hooks(history: list[dict[str, Any]]) -> Hooks:
    declared = target(lambda ctx: None, owns_state=True, history=lambda run: history)
    run = TargetRun(run_id="r", run_dir=".", namespace="r", workload=None,  # type: ignore[arg-type]
                    downstream_url="http://127.0.0.1:1", store="sqlite", seed=0)
    return Hooks(declared, run)


def test_a_misspelt_kind_in_a_targets_history_is_a_named_error_and_the_event_is_not_judged():
    """Protects: a history() hook that spelt 'claimed' as 'claim' had its events passed over by every
    invariant without a word, so a stale commit it recorded came out valid."""
    hooks = _hooks([{"kind": "created", "instance": "o", "step": "s"},
                    {"kind": "claim", "instance": "o", "step": "s", "worker": "A"},
                    {"kind": "claimed", "instance": "o", "step": "s", "worker": "B", "t": 5}])
    kept = hooks.history(end=100)
    assert [e["kind"] for e in kept] == ["created", "claimed"]
    [error] = hooks.errors
    assert "unknown kind 'claim' (1x)" in error and "claimed" in error


def test_a_field_of_the_wrong_type_in_a_targets_history_names_the_field():
    hooks = _hooks([{"kind": "committed", "instance": "o", "step": "s", "fence": "2"}])
    assert hooks.history(end=0) == []
    [error] = hooks.errors
    assert error.startswith("the target's history() hook gave 1 committed event with fence='2'")
    assert "fence is '2' (str); it must be int or None" in error
    assert hooks.history_errors == [error]  # the invariants that read its events are not judged


def test_a_history_with_an_event_not_in_the_vocabulary_is_never_judged_valid():
    """Protects: an event the checkers cannot read might hold the proof of a violation; the
    checkers judge the rest, and the verdict is unknown, naming the event, its kind and field."""
    from killpoint.harness.checkers import check_all

    def request(t: int, fence: Any) -> tuple[int, str, str, str, dict[str, Any]]:
        return (t, vocab.DOWNSTREAM, vocab.REQUEST, vocab.EVENT,
                {"resource": "payment", "key": "o:s", "outcome": vocab.APPLIED, "applied": True,
                 "fence": fence, "meta": {"instance": "o", "step": "s"}})

    good = build([request(1, 1)])
    assert check_all(good).valid is True and not good.invalid
    bad = build([request(1, 1), (2, vocab.STORE, "comitted", vocab.EVENT, {"instance": "o", "step": "s"})])
    verdict = check_all(bad)
    assert verdict.valid is None
    assert [e.index for e in bad.invalid] == [1] and bad.invalid[0].field == "kind"
    [reason] = [r for r in verdict.unknown_reasons if "not in its vocabulary" in r]
    assert "event 1 (store, kind 'comitted')" in reason
    # A violation the readable events prove still ranks above the unknown.
    duplicate = build([request(1, 1), request(2, 1), (3, vocab.HARNESS, "kil", vocab.EVENT, {})])
    assert check_all(duplicate).valid is False


def test_narration_and_the_report_show_an_event_not_in_the_vocabulary_as_written():
    from killpoint.harness.narrate import describe, line
    from killpoint.reports.timeline import build_timeline

    h = build([(1, vocab.STORE, vocab.CREATED, vocab.EVENT, {"instance": "o", "step": "s", "to_state": "pending"}),
               (2, vocab.STORE, "comitted", vocab.EVENT, {"instance": "o", "step": "s"})])
    assert describe(h.events[1]) == "comitted (not in the vocabulary: kind is wrong)"
    assert [i.index for i in build_timeline(h).items] == [0, 1]
    assert line(h.events[1]) == "store: comitted (not in the vocabulary: kind is wrong)"
