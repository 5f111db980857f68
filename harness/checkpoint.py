"""Checkpoints: is a stored instance intact, authentic, and readable by this code?

Recovery starts from whatever the store holds, written by whichever deployment ran the instance
before. Before a worker runs any step of an instance it checks, in order (DESIGN section 3):

1. **format** -- the checkpoint's format version is one this code reads;
2. **integrity** -- the hash over the checkpoint matches. A plain hash only catches accidents:
   whoever can change the data can recompute it. With an HMAC key the check authenticates, and a
   checkpoint forged without the key is refused;
3. **definition** -- the fingerprint is this code's definition, or one a registered migration
   upgrades to it.

Anything else is refused with its reason, and the worker sends the step to manual review: a
checkpoint the code cannot trust or read is never silently run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

FORMAT_VERSION = 1



class InstanceSpec(Protocol):
    """What verifying a checkpoint reads of an instance's definition
    (:class:`killpoint.harness.workload.InstanceSpec` is one): this module sits below the workloads."""

    @property
    def id(self) -> str: ...
    @property
    def data(self) -> Mapping[str, Any]: ...
    @property
    def definition(self) -> str: ...
    @property
    def definition_version(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def steps(self) -> Sequence[Any]: ...


OK = "ok"
MIGRATED = "migrated"
REFUSED = "refused"

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Migration:
    """How this code reads an instance stored under an older definition."""

    definition: str
    from_version: int
    to_version: int
    from_fingerprint: str
    to_fingerprint: str
    upgrade: Upgrade  # old instance data -> data in the new definition's shape

    @classmethod
    def between(cls, old: InstanceSpec, new: InstanceSpec, upgrade: Upgrade) -> "Migration":
        """A migration from ``old``'s definition to ``new``'s (their fingerprints name them)."""
        if old.definition != new.definition:
            raise ValueError(f"a migration stays within one definition, not {old.definition!r} -> "
                             f"{new.definition!r}")
        return cls(new.definition, old.definition_version, new.definition_version, old.fingerprint,
                   new.fingerprint, upgrade)


@dataclass(frozen=True)
class Migrations:
    """The registry of migrations this code knows; immutable, so no caller changes it for others."""

    entries: tuple[Migration, ...] = ()

    def register(self, migration: Migration) -> "Migrations":
        return Migrations(self.entries + (migration,))

    def find(self, from_fingerprint: str, to_fingerprint: str) -> Migration | None:
        for m in self.entries:
            if m.from_fingerprint == from_fingerprint and m.to_fingerprint == to_fingerprint:
                return m
        return None


@dataclass(frozen=True)
class Policy:
    """What a deployment trusts: its HMAC key (None: plain hashes) and its migrations."""

    hmac_key: bytes | None = None
    migrations: Migrations = field(default_factory=Migrations)


DEFAULT_POLICY = Policy()


@dataclass(frozen=True)
class Loaded:
    """The outcome of verifying one checkpoint: ``ok``, ``migrated`` or ``refused`` (with why)."""

    instance: str
    outcome: str
    reason: str = ""
    fingerprint: str = ""  # the stored one
    data: Mapping[str, Any] | None = None  # in this code's shape (after a migration)

    @property
    def ok(self) -> bool:
        return self.outcome != REFUSED


def integrity(instance: str, format_version: int, fingerprint: str, data: str,
              hmac_key: bytes | None = None) -> str:
    """A hash over the checkpoint; with a key, an HMAC (which, unlike a hash, authenticates)."""
    text = json.dumps([instance, format_version, fingerprint, data]).encode()
    if hmac_key:
        return "hmac:" + hmac.new(hmac_key, text, hashlib.sha256).hexdigest()
    return "sha256:" + hashlib.sha256(text).hexdigest()


def _refuse(row: Mapping[str, Any], reason: str) -> Loaded:
    return Loaded(str(row.get("id")), REFUSED, reason, str(row.get("fingerprint", "")))


def verify(row: Mapping[str, Any], spec: InstanceSpec, policy: Policy = DEFAULT_POLICY) -> Loaded:
    """Judge a stored checkpoint row (``Store.instance``) against this code's definition ``spec``.

    Pure: no I/O, so the worker, the scenarios and the tests share one judgement.
    """
    if row.get("format_version") != FORMAT_VERSION:
        return _refuse(row, f"checkpoint format version {row.get('format_version')!r}; this code "
                            f"reads version {FORMAT_VERSION}")
    stored = str(row.get("integrity", ""))
    expected = integrity(row["id"], row["format_version"], row["fingerprint"], row["data"],
                         policy.hmac_key)
    if policy.hmac_key:
        if not stored.startswith("hmac:"):
            return _refuse(row, "not authenticated: it carries a plain hash, which anyone who can "
                                "change the data can recompute; this deployment requires an HMAC")
        if not hmac.compare_digest(stored, expected):
            return _refuse(row, "HMAC mismatch: changed by someone without the key")
    elif stored.startswith("hmac:"):
        return _refuse(row, "authenticated with an HMAC key this deployment does not have, so it "
                            "cannot be verified")
    elif not hmac.compare_digest(stored, expected):
        return _refuse(row, "integrity hash mismatch: the checkpoint is corrupt")
    try:
        data = json.loads(row["data"])
    except ValueError:
        return _refuse(row, "its data is not JSON")
    if row["fingerprint"] == spec.fingerprint:
        return Loaded(spec.id, OK, "", row["fingerprint"], data)
    migration = policy.migrations.find(row["fingerprint"], spec.fingerprint)
    if migration is None:
        return _refuse(row, f"definition fingerprint {row['fingerprint']} is not this code's "
                            f"({spec.fingerprint}, {spec.definition} v{spec.definition_version}) "
                            f"and no migration is registered for it")
    return Loaded(spec.id, MIGRATED,
                  f"{migration.definition} v{migration.from_version} -> v{migration.to_version} "
                  f"by a registered migration", row["fingerprint"], migration.upgrade(dict(data)))


def checkpoint_row(spec: InstanceSpec, data: Mapping[str, Any] | None = None, *,
                   hmac_key: bytes | None = None) -> dict[str, Any]:
    """The row a deployment running ``spec``'s definition writes for it (optionally other data)."""
    text = json.dumps(dict(spec.data if data is None else data), sort_keys=True)
    return {"id": spec.id, "format_version": FORMAT_VERSION, "fingerprint": spec.fingerprint,
            "data": text, "integrity": integrity(spec.id, FORMAT_VERSION, spec.fingerprint, text, hmac_key),
            "steps": [s.name for s in spec.steps]}


def corrupt(row: Mapping[str, Any], path: tuple[str, ...] = ("amount",)) -> dict[str, Any]:
    """The row with one number of its data (at ``path``) changed after the hash was taken: a torn
    write, a bad disk. Shared by the scenario, the damaged workload and the tests, so that all of
    them damage a checkpoint the same way the verification must notice."""
    data = json.loads(row["data"])
    inner = data
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] += 1
    return {**row, "data": json.dumps(data, sort_keys=True)}


__all__ = ["DEFAULT_POLICY", "FORMAT_VERSION", "Loaded", "MIGRATED", "Migration", "Migrations", "OK", "Policy",
           "REFUSED", "checkpoint_row", "corrupt", "integrity", "verify"]
