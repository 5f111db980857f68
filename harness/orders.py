"""The built-in workloads: orders whose data comes from Faker with a seed, and their registry.

Kept apart from :mod:`killpoint.harness.workload` (the types every workload is made of) and
:mod:`killpoint.harness.checkpoint` (how a stored checkpoint is verified), which this module uses
both: the two of them no longer import each other.
"""

from __future__ import annotations

from typing import Any, Callable

from killpoint.harness.checkpoint import (CheckpointedWorkload, Migration, Migrations, Policy, checkpoint_row,
                                          corrupt)
from killpoint.harness.workload import IDEMPOTENT, LEGACY, InstanceSpec, StepSpec, Workload

__all__ = ["ORDER_VERSION", "WORKLOADS", "default_workload", "order_steps", "order_v1",
           "single_step_workload", "upgrade_order_v1"]


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
    from faker import Faker

    fake = Faker()
    fake.seed_instance(seed)
    instances = []
    for n, kind in enumerate(("plain", "declined", "amended", "flaky", "tampered"), start=1):
        amount = fake.random_int(500, 50000)
        data = {"customer": fake.name(), "email": fake.email(),
                "sku": fake.bothify("SKU-????-###").upper(), "qty": fake.random_int(1, 5),
                "amount": amount, "card": "declined" if kind == "declined" else f"tok_{fake.lexify('????')}",
                "kind": kind}
        if kind == "amended":
            data["amended_amount"] = amount + fake.random_int(100, 900)
        steps = order_steps(sku=data["sku"], qty=data["qty"], amount=amount, card=data["card"],
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


def single_step_workload(seed: int = 0) -> Workload:
    """One order with one charge: the smallest crash scenario (used by the benchmark)."""
    base = default_workload(seed).instances[0]
    inst = InstanceSpec("order-1", (base.step("charge"),), base.data)
    return Workload("single", (inst,), {"payment": {"legacy": False, "fencing": True}})


WORKLOADS: dict[str, Callable[[int], Workload]] = {"orders": default_workload, "single": single_step_workload}
