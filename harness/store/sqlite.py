"""The SQLite store: one file per run, WAL, database time for leases, one-statement compare-and-set.

Every process opens its own connection (never one inherited across a fork). Writes run in
``BEGIN IMMEDIATE`` transactions, so the event appended with a change commits with it or not at all.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any, Iterable

from harness import states
from harness.store.base import Claim, Store, StoreError, row_dict

NOW = "((julianday('now') - 2440587.5) * 86400.0)"

SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    format_version INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    data TEXT NOT NULL,
    integrity TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    instance TEXT NOT NULL,
    step TEXT NOT NULL,
    idx INTEGER NOT NULL,
    state TEXT NOT NULL,
    state_version INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    owner_worker TEXT,
    lease_version INTEGER NOT NULL DEFAULT 0,
    expires_at REAL,
    heartbeat_at REAL,
    progress_at REAL,
    PRIMARY KEY (instance, step)
);
CREATE TABLE IF NOT EXISTS receipts (
    key TEXT PRIMARY KEY,
    instance TEXT NOT NULL,
    step TEXT NOT NULL,
    intent_hash TEXT,
    status TEXT NOT NULL,
    response TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    t INTEGER NOT NULL,
    db_time REAL NOT NULL,
    kind TEXT NOT NULL,
    instance TEXT,
    step TEXT,
    worker TEXT,
    from_state TEXT,
    to_state TEXT,
    state_version INTEGER,
    fence INTEGER,
    lease_version INTEGER,
    attempt INTEGER,
    data TEXT NOT NULL DEFAULT '{}'
);
"""

_EVENT_SQL = (f"INSERT INTO events (t, db_time, kind, instance, step, worker, from_state, to_state, "
              f"state_version, fence, lease_version, attempt, data) "
              f"VALUES (?, {NOW}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


class SQLiteStore(Store):
    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self._conn: sqlite3.Connection | None = None
        self._pid = -1

    @property
    def url(self) -> str:
        return f"sqlite:///{self.path}"

    # -- connection -------------------------------------------------------------------------------
    def conn(self) -> sqlite3.Connection:
        # Invariant: a connection is only used by the process that opened it.
        if self._conn is None or self._pid != os.getpid():
            self._conn = sqlite3.connect(self.path, isolation_level=None, timeout=30,
                                         check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=30000")
            self._pid = os.getpid()
        return self._conn

    def clone(self) -> "SQLiteStore":
        """A handle with a connection of its own (for the heartbeat thread)."""
        return SQLiteStore(self.path)

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def drop(self) -> None:
        self.close()
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(self.path + suffix)
            except FileNotFoundError:
                pass

    def _write(self, fn):
        c = self.conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            result = fn(c)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        return result

    @staticmethod
    def _event(c: sqlite3.Connection, kind: str, instance: str | None, step: str | None, *,
               worker: str | None = None, from_state: str | None = None, to_state: str | None = None,
               state_version: int | None = None, fence: int | None = None,
               lease_version: int | None = None, attempt: int | None = None, **data: Any) -> None:
        c.execute(_EVENT_SQL, (time.monotonic_ns(), kind, instance, step, worker, from_state, to_state,
                               state_version, fence, lease_version, attempt,
                               json.dumps(data, default=str)))

    # -- set-up and reading -----------------------------------------------------------------------
    def setup(self, instances: Iterable[dict[str, Any]]) -> None:
        c = self.conn()
        c.executescript(SCHEMA)

        def insert(c: sqlite3.Connection) -> None:
            for seq, inst in enumerate(instances):
                c.execute("INSERT INTO instances (id, seq, format_version, fingerprint, data, integrity) "
                          "VALUES (?, ?, ?, ?, ?, ?)",
                          (inst["id"], seq, inst["format_version"], inst["fingerprint"],
                           inst["data"], inst["integrity"]))
                for idx, step in enumerate(inst["steps"]):
                    c.execute("INSERT INTO steps (instance, step, idx, state, state_version) "
                              "VALUES (?, ?, ?, ?, 1)", (inst["id"], step, idx, states.PENDING))
                    self._event(c, "created", inst["id"], step, to_state=states.PENDING, state_version=1,
                                lease_version=0, attempt=0)
        self._write(insert)

    def now(self) -> float:
        return self.conn().execute(f"SELECT {NOW}").fetchone()[0]

    def snapshot(self) -> tuple[float, list[dict[str, Any]]]:
        """Database time and every step row, in instance then step order (one read transaction)."""
        c = self.conn()
        rows = c.execute(
            f"SELECT {NOW} AS now, s.* FROM steps s JOIN instances i ON i.id = s.instance "
            f"ORDER BY i.seq, s.idx").fetchall()
        cols = [d[0] for d in c.execute("SELECT 1 AS now, * FROM steps LIMIT 0").description]
        if not rows:
            return self.now(), []
        dicts = [dict(zip(cols, r)) for r in rows]
        now = dicts[0].pop("now")
        for d in dicts[1:]:
            d.pop("now")
        return now, dicts

    def steps(self) -> list[dict[str, Any]]:
        return self.snapshot()[1]

    def instance(self, instance: str) -> dict[str, Any]:
        row = self.conn().execute("SELECT id, format_version, fingerprint, data, integrity FROM instances "
                                  "WHERE id = ?", (instance,)).fetchone()
        if row is None:
            raise StoreError(f"no instance {instance!r} in the store")
        return dict(zip(("id", "format_version", "fingerprint", "data", "integrity"), row))

    def events(self) -> list[dict[str, Any]]:
        c = self.conn()
        cur = c.execute("SELECT * FROM events ORDER BY seq")
        cols = [d[0] for d in cur.description]
        return [row_dict(dict(zip(cols, r))) for r in cur.fetchall()]

    def receipt(self, key: str) -> dict[str, Any] | None:
        row = self.conn().execute("SELECT key, instance, step, intent_hash, status, response "
                                  "FROM receipts WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        d = dict(zip(("key", "instance", "step", "intent_hash", "status", "response"), row))
        d["response"] = json.loads(d["response"])
        return d

    # -- the protocol -----------------------------------------------------------------------------
    def claim(self, instance: str, step: str, worker: str, *, expected_state_version: int,
              from_state: str, to_state: str, ttl_ms: float, reset_attempt: bool = False) -> Claim | None:
        if not states.allowed(from_state, to_state):
            raise StoreError(f"illegal claim {from_state} -> {to_state} for {instance}:{step}")
        attempt_sql = "1" if reset_attempt else "attempt + 1"

        def do(c: sqlite3.Connection) -> Claim | None:
            row = c.execute(
                f"UPDATE steps SET owner_worker = ?, lease_version = lease_version + 1, "
                f"expires_at = {NOW} + ?, heartbeat_at = {NOW}, progress_at = {NOW}, "
                f"state = ?, state_version = state_version + 1, attempt = {attempt_sql} "
                f"WHERE instance = ? AND step = ? AND state_version = ? AND state = ? "
                f"AND (owner_worker IS NULL OR expires_at < {NOW}) "
                f"RETURNING lease_version, state_version, attempt",
                (worker, ttl_ms / 1000.0, to_state, instance, step, expected_state_version,
                 from_state)).fetchone()
            if row is None:
                return None
            fence, sv, attempt = row
            self._event(c, "claimed", instance, step, worker=worker, from_state=from_state,
                        to_state=to_state, state_version=sv, fence=fence, lease_version=fence,
                        attempt=attempt)
            return Claim(instance, step, worker, fence, sv, attempt, from_state, to_state)
        return self._write(do)

    def commit(self, claim: Claim, to_state: str, *, check_fence: bool = True, check_version: bool = True,
               **detail: Any) -> bool:
        """Compare-and-set on (state_version, lease_version, owner); a refusal is recorded."""
        if not states.allowed(claim.state, to_state):
            raise StoreError(f"illegal transition {claim.state} -> {to_state} for "
                             f"{claim.instance}:{claim.step}")
        conds, args = ["instance = ?", "step = ?"], [claim.instance, claim.step]
        if check_version:
            conds.append("state_version = ?")
            args.append(claim.state_version)
        if check_fence:
            conds += ["lease_version = ?", "owner_worker = ?"]
            args += [claim.fence, claim.worker]

        def do(c: sqlite3.Connection) -> bool:
            row = c.execute(
                f"UPDATE steps SET state = ?, state_version = ?, owner_worker = NULL, expires_at = NULL, "
                f"progress_at = {NOW} WHERE {' AND '.join(conds)} RETURNING state_version, lease_version",
                [to_state, claim.state_version + 1, *args]).fetchone()
            if row is None:
                cur = c.execute("SELECT state_version, lease_version, owner_worker FROM steps "
                                "WHERE instance = ? AND step = ?", (claim.instance, claim.step)).fetchone()
                self._event(c, "commit_rejected", claim.instance, claim.step, worker=claim.worker,
                            from_state=claim.state, to_state=to_state, state_version=cur[0],
                            fence=claim.fence, lease_version=cur[1], attempt=claim.attempt,
                            expected_state_version=claim.state_version, current_owner=cur[2], **detail)
                return False
            self._event(c, "committed", claim.instance, claim.step, worker=claim.worker,
                        from_state=claim.state, to_state=to_state, state_version=row[0], fence=claim.fence,
                        lease_version=row[1], attempt=claim.attempt, **detail)
            return True
        return self._write(do)

    def settle(self, instance: str, step: str, *, expected_state_version: int, from_state: str,
               to_state: str, worker: str, **detail: Any) -> bool:
        """A lease-free planning transition (e.g. pending -> cancelled), compare-and-set on the version."""
        if not states.allowed(from_state, to_state):
            raise StoreError(f"illegal transition {from_state} -> {to_state} for {instance}:{step}")

        def do(c: sqlite3.Connection) -> bool:
            row = c.execute(
                "UPDATE steps SET state = ?, state_version = state_version + 1 WHERE instance = ? "
                "AND step = ? AND state_version = ? AND state = ? AND owner_worker IS NULL "
                "RETURNING state_version, lease_version",
                (to_state, instance, step, expected_state_version, from_state)).fetchone()
            if row is None:
                return False
            self._event(c, "committed", instance, step, worker=worker, from_state=from_state,
                        to_state=to_state, state_version=row[0], lease_version=row[1], **detail)
            return True
        return self._write(do)

    def heartbeat(self, claim: Claim, ttl_ms: float) -> bool:
        """Extend the lease, only while it is still ours (same fence, same owner)."""
        def do(c: sqlite3.Connection) -> bool:
            cur = c.execute(f"UPDATE steps SET expires_at = {NOW} + ?, heartbeat_at = {NOW} "
                            f"WHERE instance = ? AND step = ? AND lease_version = ? AND owner_worker = ?",
                            (ttl_ms / 1000.0, claim.instance, claim.step, claim.fence, claim.worker))
            return cur.rowcount == 1
        return self._write(do)

    def progress(self, claim: Claim) -> None:
        def do(c: sqlite3.Connection) -> None:
            c.execute(f"UPDATE steps SET progress_at = {NOW} WHERE instance = ? AND step = ? "
                      f"AND lease_version = ? AND owner_worker = ?",
                      (claim.instance, claim.step, claim.fence, claim.worker))
        self._write(do)

    def record_receipt(self, claim: Claim, key: str, intent_hash: str | None, status: str,
                       response: dict[str, Any]) -> None:
        def do(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR IGNORE INTO receipts (key, instance, step, intent_hash, status, response) "
                      "VALUES (?, ?, ?, ?, ?, ?)",
                      (key, claim.instance, claim.step, intent_hash, status, json.dumps(response)))
            c.execute(f"UPDATE steps SET progress_at = {NOW} WHERE instance = ? AND step = ? "
                      f"AND lease_version = ?", (claim.instance, claim.step, claim.fence))
            self._event(c, "receipt_recorded", claim.instance, claim.step, worker=claim.worker,
                        fence=claim.fence, key=key, status=status)
        self._write(do)

    def flag_stuck(self, bound_ms: float, worker: str, *, use_progress: bool = True) -> list[tuple[str, str]]:
        """Flag leases whose heartbeat goes on but whose progress stopped more than ``bound_ms`` ago,
        and free them so another worker can take over (the next claim raises the fence)."""
        if not use_progress:
            return []  # a monitor that trusts heartbeats alone never finds anything

        def do(c: sqlite3.Connection) -> list[tuple[str, str]]:
            rows = c.execute(
                f"SELECT instance, step, owner_worker, lease_version, state_version, state, "
                f"({NOW} - progress_at) * 1000.0 FROM steps WHERE owner_worker IS NOT NULL "
                f"AND expires_at >= {NOW} AND progress_at < {NOW} - ?", (bound_ms / 1000.0,)).fetchall()
            found = []
            for inst, step, owner, fence, sv, state, idle_ms in rows:
                c.execute("UPDATE steps SET owner_worker = NULL, expires_at = NULL WHERE instance = ? "
                          "AND step = ? AND lease_version = ?", (inst, step, fence))
                self._event(c, "stuck_flagged", inst, step, worker=worker, state_version=sv,
                            lease_version=fence, from_state=state, stuck_owner=owner,
                            idle_ms=round(idle_ms, 1))
                found.append((inst, step))
            return found
        return self._write(do)

    def resolve(self, instance: str, step: str, to_state: str, *, actor: str, evidence: str) -> bool:
        """An operator moves a step out of manual review by an appended event (actor, evidence)."""
        if not actor or not evidence:
            raise StoreError("an operator resolution needs both an actor and evidence")

        def do(c: sqlite3.Connection) -> bool:
            cur = c.execute("SELECT state, state_version FROM steps WHERE instance = ? AND step = ?",
                            (instance, step)).fetchone()
            if cur is None or not states.allowed(cur[0], to_state) or cur[0] != states.MANUAL:
                return False
            row = c.execute("UPDATE steps SET state = ?, state_version = state_version + 1 "
                            "WHERE instance = ? AND step = ? AND state_version = ? "
                            "RETURNING state_version, lease_version",
                            (to_state, instance, step, cur[1])).fetchone()
            self._event(c, "operator_resolved", instance, step, worker=None, from_state=cur[0],
                        to_state=to_state, state_version=row[0], lease_version=row[1], actor=actor,
                        evidence=evidence)
            return True
        return self._write(do)
