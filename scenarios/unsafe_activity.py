"""An unsafe activity: an outcome nobody can establish goes to a human, and stays there.

The order workflow ends by mailing the customer through a legacy notifier: no idempotency keys, no
receipts, nothing to query. Worker A sends order-1's mail and is killed right after the call. Did
the mail go out? The notifier cannot be asked, and sending it again could mail the customer twice,
so recovery's decision table says ``manual_review``: the worker that takes over commits the step
to ``manual_intervention`` with its reason.

Four workers run this workflow (plus A's replacement); every one of them finishes the other
orders, sees order-1's mail step in manual review, and leaves it alone: no claim, no call, no
write. Nothing moves it until a person does: once the run is quiescent, an on-call operator looks
the request up in the notifier's own log, sees that the mail was sent once, and resolves the step
to ``succeeded``. The resolution is an appended ``operator_resolved`` event carrying the actor and
the evidence, not an edit of the step's row behind the history's back, and the ``manual_stable``
invariant judges it together with everything the workers did.
"""

from __future__ import annotations

from typing import Any

from killpoint import vocab
from killpoint.harness import states
from killpoint.harness.downstream import DownstreamClient
from killpoint.harness.events import HarnessAction, PointHit, Request, StoreEvent, WorkerEvent
from killpoint.harness.run import Session
from killpoint.harness.targets import WorkerFn
from killpoint.harness.store.base import Store
from killpoint.scenarios._story import Story, config, typed, who

INSTANCE, STEP = "order-1", "notify"
ACTOR = "on-call operator"
WORKERS = 4


def run(session: Session, *, target: str | WorkerFn = "reference", seed: int = 0, store: str = "sqlite") -> Story:
    story = Story("unsafe_activity")
    resolution: list[dict[str, Any]] = []

    def operator(store_: Store, client: DownstreamClient) -> None:
        """A person, not a loop: reads the notifier's own log and records what it shows."""
        sent = [r for r in client.ledger() if r["meta"].get("instance") == INSTANCE
                and r["meta"].get("step") == STEP and r["applied"]]
        to_state = states.SUCCEEDED if sent else states.FAILED
        evidence = (f"notifier log row #{sent[0]['seq']}: the mail to the customer was sent once"
                    if sent else "the notifier's log has no mail for this order")
        done = store_.resolve(INSTANCE, STEP, to_state, actor=ACTOR, evidence=evidence)
        resolution.append({"to_state": to_state, "evidence": evidence, "done": done})

    h = story.run(session, config(target, seed, store, f"A@{STEP}.after_call:kill", workers=WORKERS,
                                  same_identity=0.0, after_quiescent=operator),
                  f"A mails the customer of {INSTANCE} through the legacy notifier and is killed "
                  f"right after; {WORKERS} workers in all", [(INSTANCE, STEP)]).history

    sent = typed(h.requests(instance=INSTANCE, step=STEP), Request)
    story.expect(len(sent) == 1 and sent[0].key is None and sent[0].applied
                 and sent[0].meta.worker == "A",
                 "A's call to the legacy notifier (no key) was applied",
                 who(sent, "key", "status", "outcome"))
    kill = [e for e in typed(h.worker_events(vocab.POINT, process="A", step=STEP), PointHit)
            if e.action == vocab.KILL]
    story.expect(kill and kill[0].point == "after_call", "A was killed right after the call",
                 who(kill, "point", "action"))
    evidence = typed(h.worker_events(vocab.RECOVER, instance=INSTANCE, step=STEP), WorkerEvent)
    story.expect(len(evidence) == 1 and evidence[0].receipt is None
                 and evidence[0].retry_safe is False and evidence[0].action == "manual_review",
                 "recovery found no receipt, an activity that is not retry-safe, and chose manual_review",
                 who(evidence, "receipt", "retry_safe", "action"))
    entry = [e for e in typed(h.store_events(INSTANCE, STEP, vocab.COMMITTED), StoreEvent)
             if e.to_state == states.MANUAL]
    story.expect(len(entry) == 1 and entry[0].reason,
                 "the step was committed to manual_intervention, with its reason",
                 who(entry, "worker", "fence", "reason"))
    if entry:
        since = entry[0].time
        touched = [e for e in h.store_events(INSTANCE, STEP) if e.time > since
                   and e.kind != "operator_resolved"]
        calls = [e for e in h.requests(instance=INSTANCE, step=STEP) if e.time > since]
        story.expect(not touched and not calls,
                     "after that no worker claimed, called for or wrote the step",
                     who(touched + calls, "worker", "fence", "to_state"))
        left = [e for e in typed(h.harness_events(vocab.EXIT), HarnessAction) if e.time > since and e.code == 0]
        story.expect(len(left) >= 3,
                     "at least three workers ran after it entered manual review, and each left it alone",
                     f"{len(left)}: " + who(left, "worker"))
        if not touched and not calls:
            story.say()
            names = ", ".join(sorted(str(e.worker) for e in left))
            story.say(f"{len(left)} worker processes saw {INSTANCE}:{STEP} in manual review and "
                      f"finished without touching it: {names}.")
    resolved = typed(h.store_events(INSTANCE, STEP, vocab.OPERATOR_RESOLVED), StoreEvent)
    story.expect(len(resolved) == 1 and resolved[0].actor == ACTOR and resolved[0].evidence
                 and resolved[0].from_state == states.MANUAL
                 and resolved[0].to_state == states.SUCCEEDED,
                 "an operator event (actor, evidence) moved it from manual_intervention to succeeded",
                 who(resolved, "actor", "to_state") + f"; {resolution}")
    story.expect(h.final_state(INSTANCE, STEP) == states.SUCCEEDED, "the step ended succeeded",
                 f"final state {h.final_state(INSTANCE, STEP)}")
    effects = h.applied(instance=INSTANCE, step=STEP)
    story.expect(len(effects) == 1, "the customer was mailed exactly once",
                 f"{len(effects)} mails: " + who(effects, "worker"))
    story.conclude("an unknown outcome of an unsafe activity went to a person and stayed there; the "
                   "person's decision is an event in the history, with who and why.")
    return story
