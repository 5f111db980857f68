"""Same identity, new fence: a worker's name is not its lease.

Supervisors restart a crashed worker under the name it had (a pod name, a host name). The store
still shows that name as the owner of the step it was working on, and it is tempting to read
"owner = me" as "I still hold it". It does not: only the fence does.

1. A claims the charge of order-1 (fence 1), charges the card with the step's key, records the
   receipt, and is killed just before its commit. It is restarted at once as A again (A.2 in the
   timeline). The step still says owner A, fence 1, lease not yet expired; the new process has no
   claim. It waits for that lease to expire, claims with fence 2, finds A's receipt and commits
   with fence 2. One worker at a time, so the story is the same on every run.
2. The supervisor restarted A too early: the old process was not dead, only frozen (SIGSTOP) right
   after its call. Now two processes carry identity A (the harness names the second one B). The
   restarted one claims with fence 2, finds the charge by its key at the provider, and commits.
   The old one wakes and commits with fence 1: the store refuses it, because its compare-and-set
   holds the lease version, which moved to 2, and both claims bear the same name: the name could
   never have told the stale process from its successor.
"""

from __future__ import annotations

from killpoint import vocab
from killpoint.harness.events import Request, Spawn, StoreEvent, WorkerOp
from killpoint.harness.run import Session
from killpoint.harness.targets import WorkerFn, resolve
from killpoint.harness.worker import WorkerContext
from killpoint.harness.workload import WORKLOADS
from killpoint.scenarios._story import Story, config, typed, who

INSTANCE, STEP = "order-1", "charge"
IDENTITY = "A"


def under_one_identity(target: str | WorkerFn, identity: str = IDENTITY) -> WorkerFn:
    """The target, with every worker process of the run under one identity: a supervisor's
    restart of a worker it wrongly believed dead."""
    fn = resolve(target)

    def one_identity(ctx: WorkerContext) -> None:
        ctx.worker_id = identity
        fn(ctx)

    one_identity.__qualname__ = f"one_identity[{target if isinstance(target, str) else fn.__qualname__}]"
    return one_identity


def run(session: Session, *, target: str | WorkerFn = "reference", seed: int = 0, store: str = "sqlite") -> Story:
    story = Story("same_identity_restart")
    key = WORKLOADS["single"](seed).instance(INSTANCE).step(STEP).key(INSTANCE)

    # 1. Killed, restarted under the same identity.
    h = story.run(session, config(target, seed, store, f"A@{STEP}.before_commit:kill",
                                  workload="single", workers=1, same_identity=1.0),
                  "1. A is killed before its commit and restarted as A (A.2)", [(INSTANCE, STEP)]).history
    spawned = [e for e in h.typed(Spawn) if e.worker == "A.2"]
    story.expect(spawned and spawned[0].identity == IDENTITY,
                 "the replacement A.2 runs under identity A",
                 who(h.harness_events(vocab.SPAWN), "worker", "identity"))
    before = [e for e in typed(h.store_events(INSTANCE, STEP), StoreEvent) if spawned and e.time < spawned[0].time]
    story.expect(before and before[-1].kind == vocab.RECEIPT_RECORDED
                 and [(c.worker, c.fence) for c in before if c.kind == vocab.CLAIMED] == [("A", 1)],
                 "when A.2 started, the store still named A the owner, with fence 1 and no commit",
                 who(before, "worker", "fence"))
    ops = typed(h.worker_events(vocab.CLAIM, process="A.2", type="ok", step=STEP), WorkerOp)
    commits = typed(h.worker_events(vocab.COMMIT, process="A.2", type="invoke", step=STEP), WorkerOp)
    story.expect([c.fence for c in ops] == [2] and [c.fence for c in commits] == [2],
                 "A.2 did not carry on under fence 1: it claimed anew (fence 2) and committed with fence 2",
                 "claims " + who(ops, "fence") + "; commits " + who(commits, "fence"))
    accepted = typed(h.store_events(INSTANCE, STEP, vocab.COMMITTED), StoreEvent)
    story.expect([(c.worker, c.fence) for c in accepted] == [(IDENTITY, 2)],
                 "the only accepted commit is A's with fence 2", who(accepted, "worker", "fence"))
    effects = h.applied(instance=INSTANCE, step=STEP)
    story.expect(len(effects) == 1, "exactly one applied effect for the charge",
                 f"{len(effects)}: " + who(effects, "key", "fence"))

    # 2. Restarted while the old process was only frozen: two processes, one identity.
    h = story.run(session, config(under_one_identity(target), seed, store, f"A@{STEP}.after_call:1*pause",
                                  wraps=target, workload="single", workers=2),
                  "2. A is frozen after its call and restarted anyway: process B runs as A too",
                  [(INSTANCE, STEP)]).history
    claims = typed(h.store_events(INSTANCE, STEP, vocab.CLAIMED), StoreEvent)
    story.expect([(c.worker, c.fence) for c in claims] == [(IDENTITY, 1), (IDENTITY, 2)],
                 "both claims are identity A's: the old process's with fence 1, the restarted one's "
                 "with fence 2", who(claims, "worker", "fence"))
    accepted = typed(h.store_events(INSTANCE, STEP, vocab.COMMITTED), StoreEvent)
    refused = typed(h.store_events(INSTANCE, STEP, vocab.COMMIT_REJECTED), StoreEvent)
    story.expect([(c.worker, c.fence) for c in accepted] == [(IDENTITY, 2)],
                 "the restarted A's commit with fence 2 was accepted", who(accepted, "worker", "fence"))
    story.expect([(c.worker, c.fence, c.lease_version) for c in refused]
                 == [(IDENTITY, 1, 2)],
                 "the old A's commit with fence 1 was refused: the lease was at fence 2, held under "
                 "the same name", who(refused, "worker", "fence", "lease_version"))
    applied = typed(h.applied(instance=INSTANCE, step=STEP), Request)
    story.expect(len(applied) == 1 and applied[0].key == key,
                 f"exactly one applied effect for the charge, under {key}",
                 f"{len(applied)}: " + who(applied, "key", "fence"))
    story.conclude("an identity names a worker, a fence names a lease: the restarted process had to "
                   "claim a new fence, and the process still holding the old one was refused.")
    return story
