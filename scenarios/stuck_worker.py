"""A stuck worker: alive by its heartbeat, dead by its progress.

Worker A claims the charge of order-1 (fence 1) and its business thread hangs right after the
claim (a deadlock, a call that never returns), while its heartbeat thread goes on renewing the
lease. By the lease alone A is healthy, so nobody may take the step over: a liveness check that
trusts heartbeats would wait forever.

The progress monitor does not trust them. Every idle worker runs it: a lease whose heartbeat is
fresh but whose step has not progressed for longer than the bound (``stuck_bound_ms``, 300 ms
here) is flagged and freed. B flags A within the bound, claims the step with fence 2, finds no
receipt anywhere (A never called), charges the card with the step's key and commits with fence 2.
A's heartbeat then finds its lease gone. When everything else is done, the harness ends A, still
hanging, with SIGKILL.
"""

from __future__ import annotations

from killpoint import vocab
from killpoint.harness.events import HarnessAction, PointHit, Request, StoreEvent
from killpoint.harness.run import Session
from killpoint.harness.targets import WorkerFn
from killpoint.harness.workload import WORKLOADS
from killpoint.scenarios._story import Story, config, typed, who

INSTANCE, STEP = "order-1", "charge"


def run(session: Session, *, target: str | WorkerFn = "reference", seed: int = 0, store: str = "sqlite") -> Story:
    story = Story("stuck_worker")
    key = WORKLOADS["single"](seed).instance(INSTANCE).step(STEP).key(INSTANCE)
    cfg = config(target, seed, store, f"A@{STEP}.heartbeat:hang", workload="single", workers=2)
    bound = cfg.timing.stuck_bound_ms
    h = story.run(session, cfg, f"A hangs right after claiming {INSTANCE}:{STEP}; its heartbeat goes on "
                                f"(stuck bound {bound:g} ms)", [(INSTANCE, STEP)]).history

    hang = [e for e in typed(h.worker_events(vocab.POINT, process="A", step=STEP), PointHit) if e.action == "hang"]
    story.expect(hang, "A's business thread hung after its claim (fence 1)", who(hang, "point", "action"))
    flags = typed(h.store_events(INSTANCE, STEP, vocab.STUCK_FLAGGED), StoreEvent)
    late = (flags[0].time - hang[0].time) / 1e6 if flags and hang else None
    slack = h.stuck_slack_ms
    story.expect(len(flags) == 1 and flags[0].stuck_owner == "A" and flags[0].worker != "A"
                 and late is not None and late <= bound + slack,
                 f"another worker flagged A stuck within the bound ({bound:g} ms + {slack:g} ms slack)",
                 who(flags, "worker", "stuck_owner", "idle_ms") + (f"; after {late:.0f} ms" if late else ""))
    claims = typed(h.store_events(INSTANCE, STEP, vocab.CLAIMED), StoreEvent)
    story.expect([c.fence for c in claims] == [1, 2] and claims[0].worker == "A"
                 and flags and claims[1].time > flags[0].time,
                 "A's lease held until the flag (the heartbeat kept it); then a new owner claimed "
                 "with fence 2",
                 who(claims, "worker", "fence"))
    owner = claims[1].worker if len(claims) > 1 else None
    commits = typed(h.store_events(INSTANCE, STEP, vocab.COMMITTED), StoreEvent)
    story.expect([(c.worker, c.fence) for c in commits] == [(owner, 2)],
                 "the new owner's commit with fence 2 was accepted", who(commits, "worker", "fence"))
    effects = typed(h.applied(instance=INSTANCE, step=STEP), Request)
    story.expect(len(effects) == 1 and effects[0].key == key and effects[0].fence == 2,
                 f"exactly one applied effect, under {key}, made with fence 2",
                 f"{len(effects)}: " + who(effects, "key", "fence"))
    ended = [e for e in typed(h.harness_events(vocab.KILL, worker="A"), HarnessAction)
             if str(e.reason).startswith("quiescent")]
    story.expect(ended, "the harness ended the still-hanging A once all else was done", who(ended, "reason"))
    story.conclude("a heartbeat proves a process is alive, not that it makes progress; the progress "
                   "monitor freed the step within its bound and the takeover raised the fence.")
    return story
