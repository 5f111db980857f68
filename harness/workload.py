"""Workloads: the instances a run executes, and what their steps ask of the downstream.

The built-in workloads and their registry ``WORKLOADS`` live in :mod:`killpoint.harness.orders`.
The default workload is an order workflow whose data comes from Faker with a seed. It is built so
that every invariant has something real to judge: a legacy step (manual review on an unknown
outcome), an amendment under the same intent version (a reused key with another amount), a declined
charge (compensation), transient downstream errors (retries and the budget), and a checkpoint
written by the previous version of the order definition, which this code reads through its
registered migration (so the checkpoint rule is judged on every run, not only in its scenario).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any

from killpoint.harness.intent import idempotency_key

FORMAT_VERSION = 1

IDEMPOTENT = "idempotent"  # keyed, replayed by the downstream, receipts can be queried
PURE = "pure"  # no downstream effect; safe to run again
LEGACY = "legacy"  # no keys, no receipts: an unknown outcome goes to manual review


@dataclass(frozen=True)
class StepSpec:
    name: str
    activity: str = IDEMPOTENT
    resource: str | None = None
    version: str = "v1"
    max_attempts: int = 3
    params: dict[str, Any] = field(default_factory=dict)
    # On a failure of this step, earlier steps with a compensation are compensated.
    compensate_on_failure: bool = False
    compensation: str | None = None  # the resource that undoes this step's effect
    # A step that (wrongly) builds its key from another step's name: the amended order.
    key_step: str | None = None

    @property
    def retry_safe(self) -> bool:
        return self.activity != LEGACY

    @property
    def queryable(self) -> bool:
        return self.activity == IDEMPOTENT

    def key(self, instance: str) -> str | None:
        if self.activity != IDEMPOTENT or self.resource is None:
            return None
        return idempotency_key(instance, self.key_step or self.name, self.resource, self.version)

    def compensation_key(self, instance: str) -> str | None:
        if self.compensation is None:
            return None
        return idempotency_key(instance, self.name, self.compensation, self.version)


@dataclass(frozen=True)
class InstanceSpec:
    id: str
    steps: tuple[StepSpec, ...]
    data: dict[str, Any] = field(default_factory=dict)
    definition: str = "order"
    definition_version: int = 1

    def step(self, name: str) -> StepSpec:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"{self.id} has no step {name!r}")

    @property
    def fingerprint(self) -> str:
        shape = [(s.name, s.activity, s.resource, s.version) for s in self.steps]
        text = json.dumps([self.definition, self.definition_version, shape])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Workload:
    name: str
    instances: tuple[InstanceSpec, ...]
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: tuple[dict[str, Any], ...] = ()

    def instance(self, instance_id: str) -> InstanceSpec:
        for inst in self.instances:
            if inst.id == instance_id:
                return inst
        raise KeyError(instance_id)

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.name for inst in self.instances for s in inst.steps))

    def downstream_config(self) -> dict[str, Any]:
        return {"resources": self.resources, "faults": list(self.faults)}

    def checkpoints(self, hmac_key: bytes | None = None) -> list[dict[str, Any]]:
        """The rows the store starts from: each instance with its integrity hash."""
        rows = []
        for inst in self.instances:
            data = json.dumps(inst.data, sort_keys=True)
            rows.append({"id": inst.id, "format_version": FORMAT_VERSION, "fingerprint": inst.fingerprint,
                         "data": data, "integrity": integrity(inst.id, FORMAT_VERSION, inst.fingerprint,
                                                              data, hmac_key),
                         "steps": [s.name for s in inst.steps]})
        return rows


def integrity(instance: str, format_version: int, fingerprint: str, data: str,
              hmac_key: bytes | None = None) -> str:
    """A hash over the checkpoint; with a key, an HMAC (which, unlike a hash, authenticates)."""
    text = json.dumps([instance, format_version, fingerprint, data]).encode()
    if hmac_key:
        return "hmac:" + hmac.new(hmac_key, text, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(text).hexdigest()
