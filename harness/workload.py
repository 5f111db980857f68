"""Workloads: the instances a run executes, and what their steps ask of the downstream.

The default workload is an order workflow whose data comes from Faker with a seed. It is built so
that every invariant has something real to judge: a legacy step (manual review on an unknown
outcome), an amendment under the same intent version (a reused key with another amount), a declined
charge (compensation), transient downstream errors (retries and the budget), and a checkpoint
written by the previous version of the order definition, which this code reads through its
registered migration (so the checkpoint rule is judged on every run, not only in its scenario).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from killpoint.errors import InvalidWorkload as InvalidWorkload
from killpoint.errors import shown
from killpoint.harness.checkpoint import (DEFAULT_POLICY, FORMAT_VERSION, Migration, Migrations, Policy, checkpoint_row,
                                          corrupt, integrity)
from killpoint.harness.intent import idempotency_key

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

    def compensation_params(self, instance: str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """What undoing this step asks of its compensation resource: the forward intent
        (``params``, default the step's own) and the key of the effect it undoes."""
        if self.compensation is None:
            return None
        return {"undo": self.key(instance), **(self.params if params is None else params)}


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

    def __post_init__(self) -> None:
        # Invariant: instance ids are unique (the store's key, the idempotency keys' first part).
        seen: dict[str, int] = {}
        for n, inst in enumerate(self.instances, start=1):
            if inst.id in seen:
                raise InvalidWorkload(f"workload {shown(self.name)}: instances {seen[inst.id]} and {n} have "
                                      f"the same id {shown(inst.id)}; give each instance an id of its own")
            seen[inst.id] = n

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


@dataclass(frozen=True)
class CheckpointedWorkload(Workload):
    """A workload whose deployment has a checkpoint policy, and whose store starts from rows an
    earlier deployment (or an accident, or an attacker) left: ``stored`` maps an instance id to
    the checkpoint fields that replace the ones this code would write."""

    policy: Policy = DEFAULT_POLICY
    stored: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))

    def checkpoints(self, hmac_key: bytes | None = None) -> list[dict[str, Any]]:
        rows = super().checkpoints(hmac_key or self.policy.hmac_key)
        return [{**row, **self.stored.get(row["id"], {})} for row in rows]


def policy_of(workload: Workload) -> Policy:
    """The checkpoint policy of the deployment a workload describes (plain hashes by default)."""
    return workload.policy if isinstance(workload, CheckpointedWorkload) else DEFAULT_POLICY


def order_steps(*, sku: str, qty: int, amount: int, card: str, email: str,
                amended_amount: int | None = None) -> tuple[StepSpec, ...]:
    charge = {"amount": amount, "currency": "EUR", "card": card}
    steps = [
        StepSpec("reserve", IDEMPOTENT, "inventory", params={"sku": sku, "qty": qty},
                 compensation="inventory-release"),
        StepSpec("charge", IDEMPOTENT, "payment", params=charge, compensate_on_failure=True),
        StepSpec("notify", LEGACY, "notify", params={"email": email, "template": "order-confirmed"}),
    ]
    if amended_amount is not None:
        # The order was amended after the charge, but the amendment reuses the charge's key and
        # intent version: the downstream must answer 422, never replay the old charge.
        steps.append(StepSpec("amend", IDEMPOTENT, "payment", key_step="charge",
                              params={**charge, "amount": amended_amount}))
    return tuple(steps)


ORDER_VERSION = 2  # the order definition this code runs; version 1 kept the amount as amount_cents


def upgrade_order_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Order v1 -> v2: version 1 stored the amount as ``amount_cents``; version 2 calls it ``amount``."""
    out = {k: v for k, v in data.items() if k != "amount_cents"}
    out["amount"] = data["amount_cents"]
    return out


def order_v1(inst: InstanceSpec) -> InstanceSpec:
    """The same order as the version 1 code defined and checkpointed it."""
    data = {k: v for k, v in inst.data.items() if k != "amount"}
    data["amount_cents"] = inst.data["amount"]
    return InstanceSpec(inst.id, inst.steps, data, inst.definition, 1)


def default_workload(seed: int = 0) -> Workload:
    """Five orders with Faker data from ``seed``: plain, declined, amended, flaky inventory, tampered.

    The code runs order definition v2; order-1 was checkpointed by the v1 code before the upgrade
    and is read through the registered v1 -> v2 migration. order-5's stored checkpoint was damaged
    after its hash was taken: a correct worker refuses it and sends its first step to manual review
    (and ``checkpoints_honoured`` has a refused checkpoint to judge in every run).
    """
    instances = []
    for n, data in enumerate(drawn_values("orders", seed, _draw_orders, _orders_fit), start=1):
        steps = order_steps(sku=data["sku"], qty=data["qty"], amount=data["amount"], card=data["card"],
                            email=data["email"], amended_amount=data.get("amended_amount"))
        instances.append(InstanceSpec(f"order-{n}", steps, data, "order", ORDER_VERSION))
    flaky, tampered = instances[3], instances[4]
    faults = ({"key": flaky.step("reserve").key(flaky.id), "action": "status:503", "times": 2},)
    resources = {"inventory": {"legacy": False, "fencing": True},
                 "inventory-release": {"legacy": False, "fencing": True},
                 "payment": {"legacy": False, "fencing": True},
                 "notify": {"legacy": True, "fencing": False}}
    stored_by_v1 = order_v1(instances[0])
    migrations = Migrations().register(Migration.between(stored_by_v1, instances[0], upgrade_order_v1))
    return CheckpointedWorkload("orders", tuple(instances), resources, faults,
                                Policy(migrations=migrations),
                                {stored_by_v1.id: checkpoint_row(stored_by_v1),
                                 tampered.id: corrupt(checkpoint_row(tampered))})


def _draw_orders(fake: Any) -> list[dict[str, Any]]:
    """What the orders workload draws from Faker, in the order it draws it: each order's data."""
    drawn = []
    for kind in ("plain", "declined", "amended", "flaky", "tampered"):
        amount = fake.random_int(500, 50000)
        customer, email = fake.name(), fake.email()
        sku, qty = fake.bothify("SKU-????-###").upper(), fake.random_int(1, 5)
        card = "declined" if kind == "declined" else f"tok_{fake.lexify('????')}"
        # An order's data, keys in this order (its checkpoint is a hash of it).
        values: dict[str, Any] = {"customer": customer, "email": email, "sku": sku, "qty": qty,
                                  "amount": amount, "card": card, "kind": kind}
        if kind == "amended":
            values["amended_amount"] = amount + fake.random_int(100, 900)
        drawn.append(values)
    return drawn


def _draw_plain(fake: Any) -> list[dict[str, Any]]:
    """What the plain workload draws from Faker, in the order it draws it."""
    return [{"customer": fake.name(), "sku": fake.bothify("SKU-????-###").upper(),
             "qty": fake.random_int(1, 5), "amount": fake.random_int(500, 50000),
             "card": f"tok_{fake.lexify('????')}"} for _ in range(3)]


# Seeds kept per workload (the most recently drawn): an exploration draws a seed per batch.
_KEPT_SEEDS = 64


# What each built-in workload's draw gives, and so what a kept entry must be to build it: the fields
# of each drawn item and their JSON types, and how many items (orders: one per kind, in order).
_ORDER_KINDS = ("plain", "declined", "amended", "flaky", "tampered")
_ORDER_FIELDS = {"customer": str, "email": str, "sku": str, "qty": int, "amount": int, "card": str,
                 "kind": str}
_PLAIN_FIELDS = {"customer": str, "sku": str, "qty": int, "amount": int, "card": str}


def _items_fit(values: Any, fields: dict[str, type], count: int) -> bool:
    """Whether ``values`` is ``count`` items, each with exactly these fields of these types (a
    JSON bool is no int here)."""
    return (isinstance(values, list) and len(values) == count
            and all(isinstance(v, dict) and set(v) >= set(fields)
                    and all(type(v[k]) is t for k, t in fields.items()) for v in values))


def _orders_fit(values: Any) -> bool:
    return (_items_fit(values, _ORDER_FIELDS, len(_ORDER_KINDS))
            and [v["kind"] for v in values] == list(_ORDER_KINDS)
            and all(set(v) - set(_ORDER_FIELDS) == ({"amended_amount"} if v["kind"] == "amended" else set())
                    for v in values)
            and type(values[2]["amended_amount"]) is int)


def _plain_fit(values: Any) -> bool:
    return _items_fit(values, _PLAIN_FIELDS, 3) and all(set(v) == set(_PLAIN_FIELDS) for v in values)


def drawn_values(name: str, seed: int, draw: Callable[[Any], list[dict[str, Any]]],
                 fits: Callable[[Any], bool] | None = None) -> list[dict[str, Any]]:
    """``draw(fake)`` for a Faker seeded with ``seed``, kept on disk once drawn.

    Importing Faker and making its generator cost a command about 130 ms, more than a run; the
    values it draws for a seed are the same every time for the same Faker and the same drawing
    code. So they are kept, as JSON, in the user's cache folder (``$XDG_CACHE_HOME/killpoint`` or
    ``~/.cache/killpoint``; ``KILLPOINT_NO_CACHE=1`` turns it off): one file per workload, named by
    the drawing code and the installed Faker (its location, size and time), holding the last
    :data:`_KEPT_SEEDS` seeds drawn. A cache that cannot be read or written is only skipped; a kept
    entry that is not what ``draw`` gives (``fits``: the workload's own check of its shape, so a
    file edited or damaged into valid JSON of another shape) is drawn again and the file rewritten,
    never a workload that fails to build, run after run.
    """
    path = _draw_cache_path(name, draw)
    kept: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, encoding="utf-8") as fh:
                loaded = json.load(fh)
            kept = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            pass
        values = kept.get(str(seed))
        if isinstance(values, list) and all(isinstance(v, dict) for v in values) \
                and (fits is None or fits(values)):
            return values
    from faker import Faker

    fake = Faker()
    fake.seed_instance(seed)
    values = draw(fake)
    if path is not None:
        kept.pop(str(seed), None)
        kept[str(seed)] = values
        while len(kept) > _KEPT_SEEDS:
            del kept[next(iter(kept))]  # the seed drawn longest ago
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".draw-")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(kept, fh)
            os.replace(tmp, path)  # whole or not at all, whoever else writes it meanwhile
        except OSError:
            pass
    return values


def _code_fingerprint(code: Any) -> tuple[Any, ...]:
    """What a function's code is, without the addresses a nested code object's repr carries."""
    consts = tuple(_code_fingerprint(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts)
    return code.co_code, consts, code.co_names


def _draw_cache_path(name: str, draw: Callable[..., Any]) -> str | None:
    if os.environ.get("KILLPOINT_NO_CACHE"):
        return None
    import importlib.util

    try:
        spec = importlib.util.find_spec("faker")
        origin = spec.origin if spec is not None else None
        st = os.stat(origin) if origin else None
    except (ImportError, ValueError, OSError):
        return None
    if st is None:
        return None
    fingerprint = hashlib.sha256(repr((name, _code_fingerprint(draw.__code__), origin, st.st_size,
                                       st.st_mtime_ns)).encode()).hexdigest()[:32]
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(home, "killpoint", "faker", f"{name}-{fingerprint}.json")


def single_step_workload(seed: int = 0) -> Workload:
    """One order with one charge: the smallest crash scenario (used by the benchmark)."""
    base = default_workload(seed).instances[0]
    inst = InstanceSpec("order-1", (base.step("charge"),), base.data)
    return Workload("single", (inst,), {"payment": {"legacy": False, "fencing": True}})


def plain_workload(seed: int = 0) -> Workload:
    """Three orders, each a reserve then a charge, with Faker data from ``seed``: every input
    well-formed. No tampered checkpoint, no legacy step, no reused key, no declined card, no
    injected downstream error -- the default for a user's own target, which a correct worker
    passes without knowing any of ``orders``' deliberate traps."""
    instances = []
    for n, data in enumerate(drawn_values("plain", seed, _draw_plain, _plain_fit), start=1):
        steps = (StepSpec("reserve", IDEMPOTENT, "inventory", params={"sku": data["sku"], "qty": data["qty"]}),
                 StepSpec("charge", IDEMPOTENT, "payment",
                          params={"amount": data["amount"], "currency": "EUR", "card": data["card"]}))
        instances.append(InstanceSpec(f"order-{n}", steps, data, "order", ORDER_VERSION))
    return Workload("plain", tuple(instances), {"inventory": {"legacy": False, "fencing": True},
                                                "payment": {"legacy": False, "fencing": True}})


WORKLOADS = {"orders": default_workload, "single": single_step_workload, "plain": plain_workload}
# What a run of a user's own target uses when neither it nor the caller names a workload.
USER_DEFAULT = "plain"


def default_for(name: object, declared: object = None) -> str:
    """The workload a target runs when nobody names one: its declared one, ``orders`` for the
    reference and the mutants, ``plain`` (no deliberately broken input) for a user's own target."""
    own = getattr(declared, "workload", None)
    if isinstance(own, str):
        return own
    if isinstance(name, str) and (name == "reference" or name.startswith("mutant:")):
        return "orders"
    return USER_DEFAULT


def resolve_workload(spec: "str | Workload", seed: int = 0) -> Workload:
    """A built-in name (``orders``, ``single``, ``plain``), ``pkg.module:function`` (called with the
    seed when it takes an argument), or a :class:`Workload` as it is."""
    if isinstance(spec, Workload):
        return spec
    if not isinstance(spec, str):
        raise InvalidWorkload(f"workload {spec!r}: give a name, pkg.module:function or a Workload")
    if spec in WORKLOADS:
        return WORKLOADS[spec](seed)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidWorkload(f"workload {spec[:200]!r}: known workloads are {', '.join(WORKLOADS)}, "
                              f"or name your own as pkg.module:function")
    import inspect

    from killpoint.harness.importing import import_user_module

    try:  # as for targets: a module in the working directory imports
        module = import_user_module(module_name)
    except ValueError as exc:
        raise InvalidWorkload(f"workload {shown(spec)}: {exc}") from None
    fn = getattr(module, attr, None)
    if isinstance(fn, Workload):
        return fn
    if not callable(fn):
        raise InvalidWorkload(f"workload {spec!r}: {module_name} has no function {attr!r}")
    try:
        takes_seed = bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        takes_seed = True
    try:
        built = fn(seed) if takes_seed else fn()
    except Exception as exc:  # noqa: BLE001 - the user's function: its failure is bad input, said once
        what = f"{type(exc).__name__}: {' '.join(str(exc).split())}".rstrip(": ")
        raise InvalidWorkload(f"workload {spec!r}: {attr}({'seed' if takes_seed else ''}) raised "
                              f"{what[:300]}") from None
    if not isinstance(built, Workload):
        raise InvalidWorkload(f"workload {spec!r}: {attr}() returned {type(built).__name__}, "
                              f"not a killpoint Workload")
    if not built.instances:
        raise InvalidWorkload(f"workload {spec!r}: it has no instances")
    return built


@functools.lru_cache(maxsize=64)
def cached_workload(name: str, seed: int) -> Workload:
    """:func:`resolve_workload` of a name, built once per (name, seed): workloads are immutable
    values, building one with Faker costs milliseconds, and a matrix asks for it once per run."""
    return resolve_workload(name, seed)
