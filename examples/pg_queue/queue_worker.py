"""A job-queue worker on its own PostgreSQL table, crash-tested as it is.

The queue is one table, ``jobs``: a worker takes the oldest job that is free (never taken, or whose
lease expired) with ``SELECT ... FOR UPDATE SKIP LOCKED``, raising the job's fencing counter as it
takes the lease; calls the payment service with a plain HTTP client (``urllib``), sending the
idempotency key and the fencing token; then acknowledges the job -- only if its lease is still the
current one. Every change is also written to ``job_events``, the queue's audit log, in the same
transaction.

killpoint never sees the queue's tables through its own store: the target *owns its state*. It
declares its crash points (two of its own, ``before_ack`` and ``after_ack``) and gives hooks:
``setup`` creates the tables for the run's workload, ``done`` says when the queue is drained,
``final_states`` maps each job to a step state, ``history`` maps the audit log into history events,
and ``teardown`` drops the run's schema.

``worker`` is correct: the key is ``job id + step``, the same on every attempt, so a retry after a
crash is answered with the stored result. ``worker_new_key_per_attempt`` is the classic bug: a fresh
key per attempt (a request id), so a retry after a crash charges the card again.

The database is ``KILLPOINT_PG_DSN`` (default: PostgreSQL on 127.0.0.1:5432, database ``test``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import psycopg

import killpoint
from killpoint import InstanceSpec, StepSpec, TargetRun, Workload, WorkerContext

DSN = os.environ.get("KILLPOINT_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
QUEUE = "charge"  # this worker consumes the charge queue: every job is a charge step
POINTS = ("before_claim", "after_claim", "before_call", "after_call", "before_ack", "after_ack")

SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, instance TEXT NOT NULL, step TEXT NOT NULL, resource TEXT NOT NULL,
    params JSONB NOT NULL, state TEXT NOT NULL DEFAULT 'pending', version INT NOT NULL DEFAULT 0,
    lease_owner TEXT, lease_expires TIMESTAMPTZ, fence BIGINT NOT NULL DEFAULT 0,
    attempts INT NOT NULL DEFAULT 0, result JSONB);
CREATE TABLE job_events (
    seq BIGSERIAL PRIMARY KEY, t BIGINT NOT NULL, kind TEXT NOT NULL, job TEXT NOT NULL,
    worker TEXT, from_state TEXT, to_state TEXT, version INT, fence BIGINT, attempt INT);
"""


def jobs(seed: int = 0) -> Workload:
    """Four charge jobs (the example's workload: ``--workload queue_worker:jobs``)."""
    instances = tuple(
        InstanceSpec(f"job-{n}", (StepSpec(QUEUE, resource="payment",
                                           params={"amount": 1000 + 250 * n + seed, "currency": "EUR"}),))
        for n in range(1, 5))
    return Workload("jobs", instances, {"payment": {"legacy": False, "fencing": True}})


def connect(schema: str) -> psycopg.Connection:
    return psycopg.connect(DSN, autocommit=True, options=f"-c search_path={schema}")


# -- the worker -------------------------------------------------------------------------------
class Queue:
    def __init__(self, ctx: WorkerContext, *, stable_key: bool) -> None:
        self.ctx = ctx
        self.stable_key = stable_key
        self.db = connect(ctx.run.namespace)
        self.ttl_ms = ctx.timing.lease_ttl_ms

    def work(self) -> None:
        while True:
            with self.ctx.at(None, QUEUE):
                self.ctx.point("before_claim")
                job = self.claim()
            if job is None:
                if self.drained():
                    return
                time.sleep(self.ctx.timing.poll_ms / 1000)
                continue
            with self.ctx.at(job["instance"], job["step"]):
                self.ctx.point("after_claim")
                self.handle(job)

    def claim(self) -> dict[str, Any] | None:
        """Take the oldest free job: never taken, or its lease expired (database time)."""
        with self.db.transaction():
            row = self.db.execute(
                "SELECT id, state, version FROM jobs WHERE state = 'pending' OR "
                "(state = 'running' AND lease_expires < now()) ORDER BY id LIMIT 1 "
                "FOR UPDATE SKIP LOCKED").fetchone()
            if row is None:
                return None
            job_id, from_state, version = row
            got = self.db.execute(
                "UPDATE jobs SET state = 'running', version = version + 1, lease_owner = %s, "
                "lease_expires = now() + make_interval(secs => %s), fence = fence + 1, "
                "attempts = attempts + 1 WHERE id = %s "
                "RETURNING id, instance, step, resource, params, fence, attempts, version",
                (self.ctx.worker_id, self.ttl_ms / 1000, job_id)).fetchone()
            job = dict(zip(("id", "instance", "step", "resource", "params", "fence", "attempt", "version"), got))
            self.event("claimed", job, from_state, "running")
        return job

    def handle(self, job: dict[str, Any]) -> None:
        key = f"{job['id']}:{job['step']}" if self.stable_key else str(uuid.uuid4())
        self.ctx.point("before_call")
        status, body = self.charge(job, key)
        self.ctx.point("after_call")
        if status == 409:
            return  # a newer lease holder exists, or its call is in flight: the job is not ours now
        self.ctx.point("before_ack")
        self.ack(job, "succeeded" if status < 300 else "failed", body)
        self.ctx.point("after_ack")

    def charge(self, job: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
        """POST the charge with the documented headers; any HTTP client would do."""
        request = urllib.request.Request(
            f"{self.ctx.downstream_url}/resources/{job['resource']}", method="POST",
            data=json.dumps({"params": job["params"]}).encode(),
            headers={"Content-Type": "application/json", "Idempotency-Key": key,
                     "Fencing-Token": str(job["fence"]), "Fencing-Scope": job["id"],
                     "Killpoint-Instance": job["instance"], "Killpoint-Step": job["step"],
                     "Killpoint-Worker": self.ctx.worker_id, "Killpoint-Attempt": str(job["attempt"])})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def ack(self, job: dict[str, Any], outcome: str, body: dict[str, Any]) -> None:
        """Finish the job, only while our lease is still the current one (its fence and owner)."""
        with self.db.transaction():
            done = self.db.execute(
                "UPDATE jobs SET state = %s, version = version + 1, lease_owner = NULL, "
                "lease_expires = NULL, result = %s WHERE id = %s AND fence = %s AND lease_owner = %s "
                "RETURNING version", (outcome, json.dumps(body), job["id"], job["fence"],
                                      self.ctx.worker_id)).fetchone()
            if done is None:
                self.event("commit_rejected", job, "running", outcome)
            else:
                self.event("committed", {**job, "version": done[0]}, "running", outcome)

    def drained(self) -> bool:
        row = self.db.execute("SELECT count(*) FROM jobs WHERE state NOT IN ('succeeded', 'failed')").fetchone()
        return row[0] == 0

    def event(self, kind: str, job: dict[str, Any], from_state: str, to_state: str) -> None:
        self.db.execute(
            "INSERT INTO job_events (t, kind, job, worker, from_state, to_state, version, fence, attempt) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (time.monotonic_ns(), kind, job["id"], self.ctx.worker_id, from_state, to_state,
             job["version"], job["fence"], job["attempt"]))


@killpoint.target(points=POINTS, owns_state=True, workload="queue_worker:jobs")
def worker(ctx: WorkerContext) -> None:
    """The correct worker: one key per job, the same on every attempt."""
    Queue(ctx, stable_key=True).work()


@killpoint.target(points=POINTS, owns_state=True, workload="queue_worker:jobs")
def worker_new_key_per_attempt(ctx: WorkerContext) -> None:
    """The buggy worker: a fresh key per attempt, so a retry after a crash charges again."""
    Queue(ctx, stable_key=False).work()


# -- the hooks (the same for both) -------------------------------------------------------------
def setup(run: TargetRun) -> None:
    with psycopg.connect(DSN, autocommit=True) as db:
        db.execute(f'CREATE SCHEMA "{run.namespace}"')
        db.execute(f'SET search_path = "{run.namespace}"')
        db.execute(SCHEMA)
        for inst in run.workload.instances:
            for step in inst.steps:
                db.execute("INSERT INTO jobs (id, instance, step, resource, params) VALUES (%s, %s, %s, %s, %s)",
                           (inst.id, inst.id, step.name, step.resource, json.dumps(step.params)))
                db.execute("INSERT INTO job_events (t, kind, job, to_state, version, fence, attempt) "
                           "VALUES (%s, 'created', %s, 'pending', 0, 0, 0)", (time.monotonic_ns(), inst.id))


def done(run: TargetRun) -> bool:
    with connect(run.namespace) as db:
        return db.execute("SELECT count(*) FROM jobs WHERE state NOT IN ('succeeded', 'failed')").fetchone()[0] == 0


def final_states(run: TargetRun) -> dict[tuple[str, str], str]:
    with connect(run.namespace) as db:
        return {(i, s): state for i, s, state in db.execute("SELECT instance, step, state FROM jobs")}


def history(run: TargetRun) -> list[dict[str, Any]]:
    """The audit log as history events: ``claimed``, ``committed``, ``commit_rejected``."""
    with connect(run.namespace) as db:
        rows = db.execute("SELECT e.t, e.kind, j.instance, j.step, e.worker, e.from_state, e.to_state, "
                          "e.version, e.fence, e.attempt FROM job_events e JOIN jobs j ON j.id = e.job "
                          "ORDER BY e.seq").fetchall()
    events = []
    for t, kind, instance, step, worker_id, from_state, to_state, version, fence, attempt in rows:
        event = {"t": t, "kind": kind, "instance": instance, "step": step, "worker": worker_id,
                 "from_state": from_state, "to_state": to_state, "fence": fence, "attempt": attempt}
        if kind != "commit_rejected":  # a rejected ack changed nothing
            event["state_version"] = version
        if kind == "claimed":
            event["lease_version"] = fence
        events.append(event)
    return events


def teardown(run: TargetRun) -> None:
    with psycopg.connect(DSN, autocommit=True) as db:
        db.execute(f'DROP SCHEMA IF EXISTS "{run.namespace}" CASCADE')


for _target in (worker, worker_new_key_per_attempt):
    for _hook in (setup, done, final_states, history, teardown):
        getattr(_target, _hook.__name__)(_hook)
