"""The store protocol: leases with fencing tokens, compare-and-set state versions, receipts, events."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol

from killpoint.errors import OutcomeUnknown, StoreError, StoreUnavailable

# Every PostgreSQL schema a run makes starts with it (here, so that naming one never imports psycopg).
SCHEMA_PREFIX = "killpoint_"

__all__ = ["Claim", "OutcomeUnknown", "Store", "StoreError", "StoreUnavailable", "row_dict"]


@dataclass(frozen=True)
class Claim:
    """A lease held on one step. ``fence`` is the lease version: the fencing token."""

    instance: str
    step: str
    worker: str
    fence: int
    state_version: int
    attempt: int
    from_state: str
    state: str  # the state the claim moved the step to


def row_dict(row: dict[str, Any]) -> dict[str, Any]:
    """Flatten an event row: its JSON ``data`` column merged into the row."""
    data = json.loads(row.pop("data") or "{}")
    return {**row, **data}


class Store(Protocol):
    """What a store does: the durable side of the step protocol. Each method is one transaction.

    The backends (:class:`~killpoint.harness.store.sqlite.SQLiteStore`,
    :class:`~killpoint.harness.store.postgres.PostgresStore`) write the protocol once, in
    :mod:`killpoint.harness.store.sql`. A worker under test sees only this surface, and every write
    here keeps the rules: a commit always compares state version, fence and owner. A mutant that
    breaks a rule wraps a store (:mod:`killpoint.harness.mutant_stores`); it is given no switch here.
    """

    @property
    def url(self) -> str:
        """Where the store lives, with any password redacted."""
        ...

    # -- set-up and reading ------------------------------------------------------------------------
    def setup(self, instances: Iterable[Mapping[str, Any]]) -> None:
        """Create the tables and insert the instances and their steps (all ``pending``)."""
        ...

    def now(self) -> float:
        """Database time, epoch seconds: the clock every lease is measured by (the run's time: the
        database's clock plus the run's offset, see :mod:`killpoint.harness.clock`)."""
        ...

    def set_clock(self, offset_s: float) -> None:
        """Set the run's offset (the harness's alone: it only grows)."""
        ...

    def snapshot(self) -> tuple[float, list[dict[str, Any]]]:
        """Database time and every step row, in instance then step order, in one read."""
        ...

    def steps(self) -> list[dict[str, Any]]:
        """Every step row, in instance then step order."""
        ...

    def step_progress(self, instance: str, step: str) -> tuple[int, str | None] | None:
        """One step's ``(state_version, owner_worker)``; None when there is no such step."""
        ...

    def events(self) -> list[dict[str, Any]]:
        """The append-only event table, oldest first, each row's ``data`` merged into it."""
        ...

    def instance(self, instance: str) -> dict[str, Any]:
        """The stored checkpoint of one instance; :class:`StoreError` when there is none."""
        ...

    def receipt(self, key: str) -> dict[str, Any] | None:
        """The receipt recorded under ``key`` (intent_hash, status, response), if any."""
        ...

    # -- the protocol -------------------------------------------------------------------------------
    def claim(self, instance: str, step: str, worker: str, *, expected_state_version: int,
              from_state: str, to_state: str, ttl_ms: float, reset_attempt: bool = False) -> Claim | None:
        """Take a lease on the step if its version and state are as seen and its lease is free or
        expired, raising the fence; None when another worker won."""
        ...

    def commit(self, claim: Claim, to_state: str, **detail: Any) -> bool:
        """Compare-and-set on (state version, fence, owner) and end the lease; False (and a
        ``commit_rejected`` event) when the claim is no longer current. ``detail`` goes into the event."""
        ...

    def settle(self, instance: str, step: str, *, expected_state_version: int, from_state: str,
               to_state: str, worker: str, **detail: Any) -> bool:
        """A lease-free planning transition (e.g. pending -> cancelled), compare-and-set on the version."""
        ...

    def heartbeat(self, claim: Claim, ttl_ms: float) -> bool:
        """Extend the lease while it is still the claim's (a ``renewed`` event); False once it is not."""
        ...

    def release(self, claim: Claim) -> bool:
        """Give the lease up without a transition while it is still the claim's (a ``released``
        event); False once it is not."""
        ...

    def progress(self, claim: Claim) -> None:
        """Note that the claim's step made progress (what the stuck-worker monitor reads)."""
        ...

    def record_receipt(self, claim: Claim, key: str, intent_hash: str | None, status: str,
                       response: dict[str, Any]) -> None:
        """Keep the first receipt for ``key``; a later one for the same key is ignored."""
        ...

    def flag_stuck(self, bound_ms: float, worker: str) -> list[tuple[str, str]]:
        """Flag and free leases whose heartbeat goes on while their step made no progress for
        ``bound_ms``; returns the (instance, step) pairs freed."""
        ...

    def resolve(self, instance: str, step: str, to_state: str, *, actor: str, evidence: str) -> bool:
        """An operator moves a step out of manual review, naming who and on what evidence."""
        ...

    # -- handles -----------------------------------------------------------------------------------
    def clone(self) -> Store:
        """A handle with a connection of its own (for the heartbeat thread)."""
        ...

    def close(self) -> None:
        """Close this process's connection; the next call opens another."""
        ...

    def drop(self) -> None:
        """Delete the store and everything in it."""
        ...

    # -- server sessions (the harness's ``terminate``) -----------------------------------------------
    def backends(self) -> dict[str, list[int]]:
        """This process's server sessions for this store and its clones: ``backend_pids``, and
        ``await_idle`` (those with a COMMIT in flight). An embedded store has none."""
        return {}

    def terminate_backends(self, pids: Iterable[int], *, await_idle: Iterable[int] = (),
                           timeout_s: float = 10.0) -> dict[str, Any]:
        """End the given server sessions (the harness's ``terminate``); only a server store can."""
        raise StoreError(f"{type(self).__name__} has no server sessions to terminate")
