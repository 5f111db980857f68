"""The mutants' broken stores: killpoint's store with one rule of its writes broken.

The store has no switch to turn a rule off: a mutant whose bug is in how it writes wraps its store
(:class:`BlindCommits`, ...), as a worker that writes the row itself would, and the functions here
are those writes. Because the claim raises the state version and the lease version (the fence) in
one statement, a stale commit is refused by either half of the compare-and-set alone; the commits
that break the compare-and-set therefore drop both halves, and each mutant says which invariant it
is there to exercise. The zoo that uses them is :mod:`killpoint.harness.mutants`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from killpoint import vocab
from killpoint.errors import StoreError
from killpoint.harness import states
from killpoint.harness.store.base import Claim, Store, StoreUnavailable
from killpoint.harness.store.sql import SqlStore

__all__ = ["BlindCommits", "Delegating", "FenceReset", "RenewByInstance", "StateGuardedCommits", "UnfencedCommits",
           "blind_commit", "state_guarded_commit", "unfenced_commit"]


def blind_commit(store: Store, claim: Claim, to_state: str, **detail: Any) -> bool:
    """Write the claim's step to ``to_state`` with no compare-and-set at all: no state version, no
    fence, no owner -- what a worker that updates the row itself does. The store records it as an
    ordinary ``committed`` event, so the history shows what such a write does to the step."""
    if not isinstance(store, SqlStore):
        raise StoreError(f"a blind commit needs an SQL store, not {type(store).__name__}")
    if not states.allowed(claim.state, to_state):
        raise StoreError(f"illegal transition {claim.state} -> {to_state} for {claim.instance}:{claim.step}")

    def do(cur: Any) -> bool:
        row = cur.execute(store._q(
            "UPDATE {steps} SET state = ?, state_version = ?, owner_worker = NULL, expires_at = NULL, "
            "progress_at = {now} WHERE instance = ? AND step = ? RETURNING state_version, lease_version"),
            (to_state, claim.state_version + 1, claim.instance, claim.step)).fetchone()
        if row is None:
            raise StoreError(f"no step {claim.instance}:{claim.step} in the store")
        store._event(cur, "committed", claim.instance, claim.step, worker=claim.worker,
                     from_state=claim.state, to_state=to_state, state_version=row[0], fence=claim.fence,
                     lease_version=row[1], attempt=claim.attempt, **detail)
        return True
    return store._write(do)


def unfenced_commit(store: Store, claim: Claim, to_state: str, **detail: Any) -> bool:
    """Write the claim's step under a compare-and-set on the state version read just before, in
    the same transaction, and no fence or owner: the version check is there, but against what the
    row holds now rather than what the claim saw, so it stops nothing the fence would have stopped.
    The chain of versions stays unbroken (+1 on whatever is there); only the fence tells the write
    was stale."""
    if not isinstance(store, SqlStore):
        raise StoreError(f"an unfenced commit needs an SQL store, not {type(store).__name__}")
    if not states.allowed(claim.state, to_state):
        raise StoreError(f"illegal transition {claim.state} -> {to_state} for {claim.instance}:{claim.step}")

    def do(cur: Any) -> bool:
        now = cur.execute(store._q("SELECT state_version FROM {steps} WHERE instance = ? AND step = ?{lock}"),
                          (claim.instance, claim.step)).fetchone()
        if now is None:
            raise StoreError(f"no step {claim.instance}:{claim.step} in the store")
        row = cur.execute(store._q(
            "UPDATE {steps} SET state = ?, state_version = state_version + 1, owner_worker = NULL, "
            "expires_at = NULL, progress_at = {now} WHERE instance = ? AND step = ? AND state_version = ? "
            "RETURNING state_version, lease_version"),
            (to_state, claim.instance, claim.step, now[0])).fetchone()
        if row is None:
            return False
        store._event(cur, "committed", claim.instance, claim.step, worker=claim.worker,
                     from_state=claim.state, to_state=to_state, state_version=row[0], fence=claim.fence,
                     lease_version=row[1], attempt=claim.attempt, **detail)
        return True
    return store._write(do)


def state_guarded_commit(store: Store, claim: Claim, to_state: str, **detail: Any) -> bool:
    """Write the claim's step guarded only by the state it claimed (``UPDATE ... WHERE step = ? AND
    state = 'running'``): no fence, no owner, no version. A stale worker's commit is refused once the
    new holder has committed (the state is no longer the claimed one), and lands in the window
    between the new holder's claim and its commit, where the state is still the claimed one."""
    if not isinstance(store, SqlStore):
        raise StoreError(f"a state-guarded commit needs an SQL store, not {type(store).__name__}")
    if not states.allowed(claim.state, to_state):
        raise StoreError(f"illegal transition {claim.state} -> {to_state} for {claim.instance}:{claim.step}")

    def do(cur: Any) -> bool:
        row = cur.execute(store._q(
            "UPDATE {steps} SET state = ?, state_version = state_version + 1, owner_worker = NULL, "
            "expires_at = NULL, progress_at = {now} WHERE instance = ? AND step = ? AND state = ? "
            "RETURNING state_version, lease_version"),
            (to_state, claim.instance, claim.step, claim.state)).fetchone()
        if row is None:
            store._event(cur, "commit_rejected", claim.instance, claim.step, worker=claim.worker,
                         from_state=claim.state, to_state=to_state, fence=claim.fence,
                         attempt=claim.attempt, **detail)
            return False
        store._event(cur, "committed", claim.instance, claim.step, worker=claim.worker,
                     from_state=claim.state, to_state=to_state, state_version=row[0], fence=claim.fence,
                     lease_version=row[1], attempt=claim.attempt, **detail)
        return True
    return store._write(do)


class Delegating:
    """A store that passes every call to ``inner``: subclass it and override the call a mutant breaks."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    @property
    def url(self) -> str:
        return self.inner.url

    def setup(self, instances: Iterable[Mapping[str, Any]]) -> None:
        self.inner.setup(instances)

    def now(self) -> float:
        return self.inner.now()

    def snapshot(self) -> tuple[float, list[dict[str, Any]]]:
        return self.inner.snapshot()

    def steps(self) -> list[dict[str, Any]]:
        return self.inner.steps()

    def step_progress(self, instance: str, step: str) -> tuple[int, str | None] | None:
        return self.inner.step_progress(instance, step)

    def events(self) -> list[dict[str, Any]]:
        return self.inner.events()

    def instance(self, instance: str) -> dict[str, Any]:
        return self.inner.instance(instance)

    def receipt(self, key: str) -> dict[str, Any] | None:
        return self.inner.receipt(key)

    def claim(self, instance: str, step: str, worker: str, *, expected_state_version: int,
              from_state: str, to_state: str, ttl_ms: float, reset_attempt: bool = False) -> Claim | None:
        return self.inner.claim(instance, step, worker, expected_state_version=expected_state_version,
                                from_state=from_state, to_state=to_state, ttl_ms=ttl_ms,
                                reset_attempt=reset_attempt)

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        return self.inner.commit(claim, to_state, **detail)

    def settle(self, instance: str, step: str, *, expected_state_version: int, from_state: str,
               to_state: str, worker: str, **detail: Any) -> bool:
        return self.inner.settle(instance, step, expected_state_version=expected_state_version,
                                 from_state=from_state, to_state=to_state, worker=worker, **detail)

    def heartbeat(self, claim: Claim, ttl_ms: float) -> bool:
        return self.inner.heartbeat(claim, ttl_ms)

    def release(self, claim: Claim) -> bool:
        return self.inner.release(claim)

    def progress(self, claim: Claim) -> None:
        self.inner.progress(claim)

    def record_receipt(self, claim: Claim, key: str, intent_hash: str | None, status: str,
                       response: dict[str, Any]) -> None:
        self.inner.record_receipt(claim, key, intent_hash, status, response)

    def flag_stuck(self, bound_ms: float, worker: str) -> list[tuple[str, str]]:
        return self.inner.flag_stuck(bound_ms, worker)

    def resolve(self, instance: str, step: str, to_state: str, *, actor: str, evidence: str) -> bool:
        return self.inner.resolve(instance, step, to_state, actor=actor, evidence=evidence)

    def clone(self) -> Store:
        return type(self)(self.inner.clone())

    def close(self) -> None:
        self.inner.close()

    def drop(self) -> None:
        self.inner.drop()

    def backends(self) -> dict[str, list[int]]:
        return self.inner.backends()

    def terminate_backends(self, pids: Iterable[int], *, await_idle: Iterable[int] = (),
                           timeout_s: float = 10.0) -> dict[str, Any]:
        return self.inner.terminate_backends(pids, await_idle=await_idle, timeout_s=timeout_s)

    def set_clock(self, offset_s: float) -> None:
        self.inner.set_clock(offset_s)


class BlindCommits(Delegating):
    """A store whose every commit is a :func:`blind_commit`: the compare-and-set is gone."""

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        return blind_commit(self.inner, claim, to_state, **detail)


class UnfencedCommits(Delegating):
    """A store whose every commit is an :func:`unfenced_commit`: no fence, a version read afresh."""

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        return unfenced_commit(self.inner, claim, to_state, **detail)


class StateGuardedCommits(Delegating):
    """Commits guarded by the claimed state alone (see :func:`state_guarded_commit`)."""

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        return state_guarded_commit(self.inner, claim, to_state, **detail)


class RenewByInstance(Delegating):
    """A store whose heartbeat renews a step's lease by instance and step alone, not by holder and
    fence, and records the renewal as any renewal (who renewed, with which fence)."""

    def heartbeat(self, claim: Claim, ttl_ms: float) -> bool:
        store = self.inner
        if not isinstance(store, SqlStore):
            raise StoreError(f"renewing by instance needs an SQL store, not {type(store).__name__}")

        def do(cur: Any) -> bool:
            row = cur.execute(store._q(
                "UPDATE {steps} SET expires_at = {now} + ?, heartbeat_at = {now} "
                "WHERE instance = ? AND step = ? RETURNING lease_version"),
                (ttl_ms / 1000.0, claim.instance, claim.step)).fetchone()
            if row is None:
                return False
            store._event(cur, "renewed", claim.instance, claim.step, worker=claim.worker,
                         fence=claim.fence, lease_version=row[0])
            return True
        try:
            return store._write(do, points=False)
        except StoreUnavailable:
            return False  # as the real heartbeat: a lost connection must not end the thread


class FenceReset(Delegating):
    """A store whose every claim sets the lease version (the fencing token) to 1 instead of raising
    it: a lease generation reset on re-grant, so each holder of a step gets the same token."""

    def claim(self, instance: str, step: str, worker: str, *, expected_state_version: int,
              from_state: str, to_state: str, ttl_ms: float, reset_attempt: bool = False) -> Claim | None:
        store = self.inner
        if not isinstance(store, SqlStore):
            raise StoreError(f"a fence reset needs an SQL store, not {type(store).__name__}")
        if not states.allowed(from_state, to_state):
            raise StoreError(f"illegal claim {from_state} -> {to_state} for {instance}:{step}")
        attempt_sql = "1" if reset_attempt else "attempt + 1"

        def do(cur: Any) -> Claim | None:
            row = cur.execute(store._q(
                "UPDATE {steps} SET owner_worker = ?, lease_version = 1, "
                "expires_at = {now} + ?, heartbeat_at = {now}, progress_at = {now}, "
                f"state = ?, state_version = state_version + 1, attempt = {attempt_sql} "
                "WHERE instance = ? AND step = ? AND state_version = ? AND state = ? "
                "AND (owner_worker IS NULL OR expires_at < {now}) "
                "RETURNING lease_version, state_version, attempt"),
                (worker, ttl_ms / 1000.0, to_state, instance, step, expected_state_version,
                 from_state)).fetchone()
            if row is None:
                return None
            fence, sv, attempt = row
            store._event(cur, vocab.CLAIMED, instance, step, worker=worker, from_state=from_state,
                         to_state=to_state, state_version=sv, fence=fence, lease_version=fence,
                         attempt=attempt)
            return Claim(instance, step, worker, fence, sv, attempt, from_state, to_state)
        return store._write(do)
