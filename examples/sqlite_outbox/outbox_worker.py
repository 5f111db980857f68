"""A transactional-outbox worker on SQLite, crash-tested as it is.

The application accepts an order and, in the same SQLite transaction, writes the message that will
charge it into an ``outbox`` table. A relay then takes undelivered messages under a lease (a fencing
counter raised on every take, the lease's end in database time), delivers each to the payment
service with a plain HTTP client (``http.client``), and marks it delivered -- only if its lease is
still the current one.

killpoint never sees these tables through its own store: the target *owns its state* (one SQLite
file in the run's folder), declares its crash points -- ``before_deliver``, ``after_deliver``,
``before_mark`` and ``after_mark`` are its own -- and gives ``setup``, ``done`` and ``final_states``.

``worker`` is correct: a message's idempotency key is the message id, written with it in the
outbox, so a redelivery after a crash is answered with the stored result. ``worker_new_key_per_delivery``
mints a key at every delivery attempt, so a redelivery charges again.
"""

from __future__ import annotations

import http.client
import json
import os
import sqlite3
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import killpoint
from killpoint import InstanceSpec, StepSpec, TargetRun, Workload, WorkerContext

POINTS = ("before_accept", "after_accept", "before_deliver", "after_deliver", "before_mark", "after_mark")
STEP = "charge"

SCHEMA = """
CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL, state TEXT NOT NULL DEFAULT 'new');
CREATE TABLE outbox (
    id TEXT PRIMARY KEY, instance TEXT NOT NULL, resource TEXT NOT NULL, body TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending', fence INTEGER NOT NULL DEFAULT 0, owner TEXT,
    lease_until REAL, attempts INTEGER NOT NULL DEFAULT 0);
"""


def orders(seed: int = 0) -> Workload:
    """Three orders to charge (the example's workload: ``--workload outbox_worker:orders``)."""
    instances = tuple(
        InstanceSpec(f"order-{n}", (StepSpec(STEP, resource="payment",
                                             params={"amount": 700 + 100 * n + seed, "currency": "EUR"}),))
        for n in range(1, 4))
    return Workload("outbox-orders", instances, {"payment": {"legacy": False, "fencing": True}})


def database(run_dir: str) -> sqlite3.Connection:
    db = sqlite3.connect(os.path.join(run_dir, "outbox.sqlite"), isolation_level=None, timeout=10)
    db.execute("PRAGMA journal_mode=WAL")
    return db


class Relay:
    def __init__(self, ctx: WorkerContext, *, stable_key: bool) -> None:
        self.ctx = ctx
        self.stable_key = stable_key
        self.db = database(ctx.run_dir)
        url = urlsplit(ctx.downstream_url)
        self.http = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        self.path = url.path

    def work(self) -> None:
        while True:
            accepted = self.accept_one()
            delivered = self.deliver_one()
            if accepted or delivered:
                continue
            if self.drained():
                return
            time.sleep(self.ctx.timing.poll_ms / 1000)

    def accept_one(self) -> bool:
        """Accept a new order: its state and its outbox message in one transaction."""
        row = self.db.execute("SELECT id, amount FROM orders WHERE state = 'new' LIMIT 1").fetchone()
        if row is None:
            return False
        order_id, amount = row
        with self.ctx.at(order_id, STEP):
            self.ctx.point("before_accept")
            self.db.execute("BEGIN IMMEDIATE")
            try:
                changed = self.db.execute("UPDATE orders SET state = 'accepted' WHERE id = ? AND state = 'new'",
                                          (order_id,)).rowcount
                if changed:
                    body = json.dumps({"params": {"amount": amount, "currency": "EUR"}})
                    self.db.execute("INSERT INTO outbox (id, instance, resource, body) VALUES (?, ?, 'payment', ?)",
                                    (f"{order_id}:{STEP}", order_id, body))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.ctx.point("after_accept")
        return True

    def deliver_one(self) -> bool:
        message = self.take()
        if message is None:
            return False
        msg_id, instance, resource, body, fence = message
        with self.ctx.at(instance, STEP):
            key = msg_id if self.stable_key else uuid.uuid4().hex
            self.ctx.point("before_deliver")
            status = self.post(f"{self.path}/resources/{resource}", body, {
                "Content-Type": "application/json", "Idempotency-Key": key, "Fencing-Token": str(fence),
                "Fencing-Scope": msg_id, "Killpoint-Instance": instance, "Killpoint-Step": STEP,
                "Killpoint-Worker": self.ctx.worker_id})
            self.ctx.point("after_deliver")
            if status == 409:
                return True  # a newer holder has it, or its delivery is in flight: not ours now
            self.ctx.point("before_mark")
            self.db.execute("UPDATE outbox SET state = ?, owner = NULL, lease_until = NULL "
                            "WHERE id = ? AND fence = ? AND owner = ?",
                            ("delivered" if status < 300 else "failed", msg_id, fence, self.ctx.worker_id))
            self.ctx.point("after_mark")
        return True

    def post(self, path: str, body: str, headers: dict[str, str]) -> int:
        """POST over the kept-alive connection; once more on a fresh one if the server had closed
        it (sending the same message again is what its idempotency key is for)."""
        for attempt in (1, 2):
            try:
                self.http.request("POST", path, body=body, headers=headers)
                answer = self.http.getresponse()
                answer.read()
                return answer.status
            except (http.client.HTTPException, ConnectionError):
                self.http.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def take(self) -> tuple[Any, ...] | None:
        """Lease the oldest undelivered message whose lease is free, raising its fence."""
        ttl_days = self.ctx.timing.lease_ttl_ms / 86_400_000
        self.db.execute("BEGIN IMMEDIATE")
        try:
            row = self.db.execute(
                "SELECT id FROM outbox WHERE state = 'pending' AND (owner IS NULL OR lease_until < julianday('now')) "
                "ORDER BY id LIMIT 1").fetchone()
            if row is None:
                self.db.execute("COMMIT")
                return None
            taken = self.db.execute(
                "UPDATE outbox SET owner = ?, lease_until = julianday('now') + ?, fence = fence + 1, "
                "attempts = attempts + 1 WHERE id = ? RETURNING id, instance, resource, body, fence",
                (self.ctx.worker_id, ttl_days, row[0])).fetchone()
            self.db.execute("COMMIT")
            return taken
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def drained(self) -> bool:
        left = self.db.execute("SELECT (SELECT count(*) FROM orders WHERE state = 'new') + "
                               "(SELECT count(*) FROM outbox WHERE state = 'pending')").fetchone()[0]
        return left == 0


@killpoint.target(points=POINTS, owns_state=True, workload="outbox_worker:orders")
def worker(ctx: WorkerContext) -> None:
    """The correct relay: the message id is the idempotency key."""
    Relay(ctx, stable_key=True).work()


@killpoint.target(points=POINTS, owns_state=True, workload="outbox_worker:orders")
def worker_new_key_per_delivery(ctx: WorkerContext) -> None:
    """The buggy relay: a fresh key per delivery attempt."""
    Relay(ctx, stable_key=False).work()


def setup(run: TargetRun) -> None:
    db = database(run.run_dir)
    db.executescript(SCHEMA)
    for inst in run.workload.instances:
        db.execute("INSERT INTO orders (id, amount) VALUES (?, ?)", (inst.id, inst.step(STEP).params["amount"]))
    db.close()


def done(run: TargetRun) -> bool:
    db = database(run.run_dir)
    try:
        return db.execute("SELECT (SELECT count(*) FROM orders WHERE state = 'new') + "
                          "(SELECT count(*) FROM outbox WHERE state = 'pending')").fetchone()[0] == 0
    finally:
        db.close()


STATES = {"delivered": "succeeded", "failed": "failed", "pending": "running"}


def final_states(run: TargetRun) -> dict[tuple[str, str], str]:
    db = database(run.run_dir)
    try:
        states = {(i, STEP): "pending" for (i,) in db.execute("SELECT id FROM orders")}
        for instance, state in db.execute("SELECT instance, state FROM outbox"):
            states[(instance, STEP)] = STATES[state]
        return states
    finally:
        db.close()


for _target in (worker, worker_new_key_per_delivery):
    for _hook in (setup, done, final_states):
        getattr(_target, _hook.__name__)(_hook)
