"""The store protocol: leases with fencing tokens, compare-and-set state versions, receipts, events."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class StoreError(RuntimeError):
    """The store was asked for something it must refuse (an illegal transition, a missing instance)."""


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
