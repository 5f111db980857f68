"""The store protocol: leases with fencing tokens, compare-and-set state versions, receipts, events."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from killpoint.errors import OutcomeUnknown, StoreError, StoreUnavailable

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


class Store:
    """Base class of the backends. Each method is one transaction; see the SQLite backend."""

    url: str

    def setup(self, instances): raise NotImplementedError
    def snapshot(self): raise NotImplementedError
    def steps(self): raise NotImplementedError
    def events(self): raise NotImplementedError
    def instance(self, instance): raise NotImplementedError
    def receipt(self, key): raise NotImplementedError
    def claim(self, instance, step, worker, **kw): raise NotImplementedError
    def commit(self, claim, to_state, **kw): raise NotImplementedError
    def settle(self, instance, step, **kw): raise NotImplementedError
    def heartbeat(self, claim, ttl_ms): raise NotImplementedError
    def record_receipt(self, claim, key, intent_hash, status, response): raise NotImplementedError
    def flag_stuck(self, bound_ms, worker, **kw): raise NotImplementedError
    def resolve(self, instance, step, to_state, **kw): raise NotImplementedError
    def clone(self): raise NotImplementedError
    def close(self): raise NotImplementedError
    def drop(self): raise NotImplementedError

    def backends(self) -> dict[str, list[int]]:
        """This process's server sessions for this store and its clones: ``backend_pids``, and
        ``await_idle`` (those with a COMMIT in flight). An embedded store has none."""
        return {}

    def terminate_backends(self, pids, *, await_idle=(), timeout_s: float = 10.0) -> dict[str, object]:
        """End the given server sessions (the harness's ``terminate``); only a server store can."""
        raise StoreError(f"{type(self).__name__} has no server sessions to terminate")
