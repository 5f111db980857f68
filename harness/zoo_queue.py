"""A job queue that owns its state, for the mutant zoo: the takeover window of a target killpoint's
store does not see.

The queue is one SQLite file in the run's folder: a ``jobs`` table (a lease per job: its owner, its
end on the run clock, a fence raised on every take) and ``job_events``, the audit log its
``history()`` hands to the invariants. A worker takes the oldest free job (``taken``, its claim
point), renews the lease at each step of its work, as a worker whose work is made of several calls
does (its heartbeat), calls the payment service with a stable key and its fence, and acknowledges
the job only while its lease is the current one.

``fenced_renewal`` renews only the lease it holds (``WHERE id = ? AND owner = ? AND fence = ?``): a
worker paused past its lease finds it gone when it comes back and drops the job.
``renew_by_id`` renews by job id alone, as long as the job is running (``WHERE id = ? AND state =
'running'``): back from a pause after the new holder acknowledged the job, it finds nothing to renew
and drops it too, so a pause that resumes late shows nothing; back while the new holder holds the
job, it renews the new holder's lease as its own and goes on (``lease_fenced``). Only a pause that
resumes in the takeover window (``pause(until=taken)``) shows it: the mutant ``renew-by-id-owned``.

The lease arithmetic reads ``ctx.clock`` (``run_clock=True``), so it runs on the run clock with
production-like timings; ``lease_points`` and ``claim_point`` tell the matrix where to pause.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from typing import Any, Iterator

import killpoint
from killpoint import InstanceSpec, StepSpec, TargetRun, Workload, WorkerContext
from killpoint.harness.libs.common import Downstream

POINTS = ("before_take", "taken", "before_call", "after_call", "before_ack", "after_ack")
LEASE_POINTS = ("taken", "before_call", "after_call", "before_ack")
STEP = "charge"
SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, instance TEXT NOT NULL, params TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending', version INTEGER NOT NULL DEFAULT 0, owner TEXT,
    lease_until REAL, fence INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0);
CREATE TABLE job_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, t INTEGER NOT NULL, kind TEXT NOT NULL, job TEXT NOT NULL, worker TEXT,
    from_state TEXT, to_state TEXT, version INTEGER, fence INTEGER, attempt INTEGER);
"""


def jobs(seed: int = 0) -> Workload:
    """Three charge jobs."""
    instances = tuple(InstanceSpec(f"job-{n}", (StepSpec(STEP, resource="payment",
                                                         params={"amount": 900 + 150 * n + seed, "currency": "EUR"}),))
                      for n in range(1, 4))
    return Workload("queue-jobs", instances, {"payment": {"legacy": False, "fencing": True}})


def _db(run_dir: str) -> sqlite3.Connection:
    db = sqlite3.connect(os.path.join(run_dir, "queue.sqlite"), isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    return db


class _Worker:
    def __init__(self, ctx: WorkerContext, *, renew_by_id: bool) -> None:
        self.ctx, self.renew_by_id = ctx, renew_by_id
        self.db = _db(ctx.run_dir)
        self.ttl_s = ctx.timing.lease_ttl_ms / 1000.0
        self.http = Downstream(ctx.downstream_url, ctx.worker_id)

    def work(self) -> None:
        while True:
            job = self.next_job()
            if job is None:
                if self.left() == 0:
                    return
                self.ctx.clock.sleep(self.ctx.timing.poll_ms / 1000.0)
                continue
            with self.ctx.at(job["instance"], STEP):
                self.ctx.point("taken")
                self.handle(job)

    def next_job(self) -> dict[str, Any] | None:
        """The claim loop's turn: ``before_take`` (at the queue's step, no job yet), then a take."""
        with self.ctx.at(None, STEP):
            self.ctx.point("before_take")
            return self.take()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def take(self) -> dict[str, Any] | None:
        now = self.ctx.clock.now()
        with self.transaction():
            row = self.db.execute("SELECT id, state FROM jobs WHERE state = 'pending' OR (state = 'running' "
                                  "AND lease_until < ?) ORDER BY id LIMIT 1", (now,)).fetchone()
            if row is None:
                return None
            got = self.db.execute(
                "UPDATE jobs SET state = 'running', version = version + 1, owner = ?, lease_until = ?, "
                "fence = fence + 1, attempts = attempts + 1 WHERE id = ? "
                "RETURNING id, instance, params, fence, attempts, version",
                (self.ctx.worker_id, now + self.ttl_s, row[0])).fetchone()
            job = dict(zip(("id", "instance", "params", "fence", "attempt", "version"), got))
            self.event("claimed", job, row[1], "running")
        return job

    def renew(self, job: dict[str, Any]) -> bool:
        """The heartbeat: push the lease's end on. False: the lease is gone, drop the job."""
        until = self.ctx.clock.now() + self.ttl_s
        args: tuple[Any, ...]
        if self.renew_by_id:  # the bug: any running job with this id, whoever holds it now
            sql, args = "UPDATE jobs SET lease_until = ? WHERE id = ? AND state = 'running'", (until, job["id"])
        else:
            sql, args = ("UPDATE jobs SET lease_until = ? WHERE id = ? AND owner = ? AND fence = ?",
                         (until, job["id"], self.ctx.worker_id, job["fence"]))
        with self.transaction():
            renewed = self.db.execute(sql, args).rowcount == 1
            if renewed:
                self.event("renewed", job, "running", "running")
        return renewed

    def handle(self, job: dict[str, Any]) -> None:
        self.ctx.point("before_call")
        if not self.renew(job):
            return
        status = self.call(job)
        self.ctx.point("after_call")
        if status == 409:
            return  # a newer holder's fence, or its call in flight: not ours now
        self.ctx.point("before_ack")
        if not self.renew(job):
            return
        self.ack(job, "succeeded" if status < 300 else "failed")
        self.ctx.point("after_ack")

    def call(self, job: dict[str, Any]) -> int:
        status, _ = self.http.post("payment", json.loads(job["params"]), key=f"{job['id']}:{STEP}",
                                   instance=job["instance"], step=STEP, attempt=job["attempt"],
                                   fence=job["fence"], scope=job["id"])
        return status

    def ack(self, job: dict[str, Any], outcome: str) -> None:
        with self.transaction():
            row = self.db.execute("UPDATE jobs SET state = ?, version = version + 1, owner = NULL, lease_until = NULL "
                                  "WHERE id = ? AND owner = ? AND fence = ? RETURNING version",
                                  (outcome, job["id"], self.ctx.worker_id, job["fence"])).fetchone()
            if row is None:
                self.event("commit_rejected", job, "running", outcome)
            else:
                self.event("committed", {**job, "version": row[0]}, "running", outcome)

    def left(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')").fetchone()[0])

    def event(self, kind: str, job: dict[str, Any], from_state: str, to_state: str) -> None:
        self.db.execute("INSERT INTO job_events (t, kind, job, worker, from_state, to_state, version, fence, attempt) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (time.monotonic_ns(), kind, job["id"], self.ctx.worker_id,
                                                               from_state, to_state, job["version"], job["fence"],
                                                               job["attempt"]))


def setup(run: TargetRun) -> None:
    db = _db(run.run_dir)
    try:
        db.executescript(SCHEMA)
        for inst in run.workload.instances:
            db.execute("INSERT INTO jobs (id, instance, params) VALUES (?, ?, ?)",
                       (f"{inst.id}-{STEP}", inst.id, json.dumps(dict(inst.step(STEP).params))))
    finally:
        db.close()


def done(run: TargetRun) -> bool:
    db = _db(run.run_dir)
    try:
        return db.execute("SELECT count(*) FROM jobs WHERE state IN ('pending', 'running')").fetchone()[0] == 0
    finally:
        db.close()


def final_states(run: TargetRun) -> dict[tuple[str, str], str]:
    db = _db(run.run_dir)
    try:
        return {(i, STEP): s for i, s in db.execute("SELECT instance, state FROM jobs")}
    finally:
        db.close()


def history(run: TargetRun) -> list[dict[str, Any]]:
    """The audit log as store events: ``claimed``, ``renewed``, ``committed``, ``commit_rejected``."""
    db = _db(run.run_dir)
    try:
        rows = db.execute("SELECT e.t, e.kind, j.instance, e.worker, e.from_state, e.to_state, e.version, "
                          "e.fence, e.attempt FROM job_events e JOIN jobs j ON j.id = e.job ORDER BY e.seq").fetchall()
    finally:
        db.close()
    events = []
    for t, kind, instance, worker_id, from_state, to_state, version, fence, attempt in rows:
        event = {"t": t, "kind": kind, "instance": instance, "step": STEP, "worker": worker_id,
                 "from_state": from_state, "to_state": to_state, "fence": fence, "attempt": attempt}
        if kind in ("claimed", "committed"):  # a renewal or a refused ack changed no state
            event["state_version"] = version
        if kind == "claimed":
            event["lease_version"] = fence
        events.append(event)
    return events


def _declare(name: str, *, renew_by_id: bool) -> killpoint.Target:
    def body(ctx: WorkerContext) -> None:
        _Worker(ctx, renew_by_id=renew_by_id).work()

    body.__name__ = body.__qualname__ = name
    return killpoint.Target(body, name=f"killpoint.harness.zoo_queue:{name}", points=POINTS, owns_state=True,
                            workload="killpoint.harness.zoo_queue:jobs", run_clock=True,
                            lease_points=LEASE_POINTS, claim_point="taken", setup=setup, done=done,
                            final_states=final_states, history=history)


fenced_renewal = _declare("fenced_renewal", renew_by_id=False)
renew_by_id = _declare("renew_by_id", renew_by_id=True)
