"""The SQLite store: one file per run, WAL, database time for leases, one-statement compare-and-set.

The protocol itself is :mod:`harness.store.sql`; this is SQLite's dialect and transactions. Every
process opens its own connection (never one inherited across a fork). Writes run in ``BEGIN
IMMEDIATE`` transactions (writers serialised), so the event appended with a change commits with it
or not at all, and a read that precedes a write in one transaction needs no row lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from typing import Any, Callable, Iterable, Mapping, TypeVar

from killpoint import vocab
from killpoint.harness import states
from killpoint.harness.store.sql import SqlStore

T = TypeVar("T")

NOW = "((julianday('now') - 2440587.5) * 86400.0)"

SCHEMA = """
CREATE TABLE IF NOT EXISTS clock (
    offset_s REAL NOT NULL
);
INSERT INTO clock (offset_s) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM clock);
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
    seq INTEGER PRIMARY KEY,  -- rows are never deleted, so each new seq is the largest plus one
                              -- (AUTOINCREMENT would add a write of sqlite_sequence to every event)
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


# A set-up store's file, by what it was set up with (see SQLiteStore.setup). Invariant: an image
# holds the schema, the instances and steps, and their ``created`` events, and nothing else.
_TEMPLATES: dict[str, bytes] = {}
_TEMPLATES_MAX = 8  # a session runs one workload or a few; a matrix over many seeds keeps the first


def _template_key(instances: list[Mapping[str, Any]]) -> str:
    return hashlib.sha1(json.dumps(instances, sort_keys=True, default=str).encode()).hexdigest()


class SQLiteStore(SqlStore):
    NOW = NOW

    def __init__(self, path: str | os.PathLike[str], *, harness_pid: int | None = None):
        self.path = os.fspath(path)
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        # The harness's own handle (set-up, the clock, its reads, the last close) skips fsync: runs
        # kill processes, never the machine, and data a killed process wrote survives in the OS
        # without it. The workers' connections keep synchronous=NORMAL, as a deployment would.
        self._harness_pid = harness_pid

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
            sync = "OFF" if os.getpid() == self._harness_pid else "NORMAL"
            self._conn.execute(f"PRAGMA synchronous={sync}")
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

    def _write(self, fn: Callable[[sqlite3.Connection], T], *, points: bool = True) -> T:
        c = self.conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            result = fn(c)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")
        return result

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return fn(self.conn())  # one statement in autocommit mode: a consistent read

    def _tables(self) -> dict[str, str]:
        return {"steps": "steps", "receipts": "receipts", "events": "events", "instances": "instances",
                "clock": "clock"}

    # -- set-up and reading -----------------------------------------------------------------------
    def setup(self, instances: Iterable[Mapping[str, Any]]) -> None:
        """Create the tables and the steps of ``instances``, each with its ``created`` event.

        A run's store is set up the same way for every run of a workload: the first set-up's file
        is kept in memory as a template, and the next store of the same instances starts as a copy
        of it, with its events' times made this set-up's (one statement, where the set-up was the
        schema's and a transaction of inserts). The rows are the same either way."""
        instances = list(instances)
        key = _template_key(instances)
        image = _TEMPLATES.get(key)
        if image is not None and self._conn is None and self._from_template(image):
            return
        self._create(instances)
        if image is None and len(_TEMPLATES) < _TEMPLATES_MAX:
            c = self.conn()
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the file itself
            with open(self.path, "rb") as fh:
                _TEMPLATES[key] = fh.read()

    def _from_template(self, image: bytes) -> bool:
        """Start the store as a copy of ``image`` (False: the file is there already: set it up)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            view = memoryview(image)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        # Each created event's time as a fresh insert would have it: this process's monotonic
        # clock (in order, one nanosecond apart) and the database's time now.
        t = time.monotonic_ns()
        self._write(lambda c: c.execute(self._q("UPDATE {events} SET t = ? + seq, db_time = {now}"), (t,)))
        return True

    def _create(self, instances: list[Mapping[str, Any]]) -> None:
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
                    self._event(c, vocab.CREATED, inst["id"], step, to_state=states.PENDING, state_version=1,
                                lease_version=0, attempt=0)
        self._write(insert)
