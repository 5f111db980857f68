"""The PostgreSQL store: a schema per run, database time for leases, one-statement compare-and-set.

The protocol is :mod:`harness.store.sql`, shared with SQLite; this module is PostgreSQL's dialect
(``%s`` placeholders, a schema per run, row locks) and its transactions. What it needs beyond SQLite:

* **One connection per process per handle.** Workers are forked from the harness, so the handle
  (and any connection it holds) is copied into every child. A connection is only used by the
  process that opened it (:meth:`PostgresStore.conn` checks the PID, as the SQLite store does);
  the copy a child inherited is never closed there, since closing it would end the parent's
  session. The heartbeat thread gets a handle of its own through :meth:`clone`. No pool: a pool's
  connections must never be shared across a fork, and one connection per handle is all we use.
* **Every method is one transaction, reads included** (``autocommit`` off, committed at the end),
  so no connection sits idle in a transaction holding locks that would block the next statement
  or the schema's ``DROP`` at the end of the run.
* **Database time** is ``clock_timestamp()`` as epoch seconds (``double precision``), so
  ``expires_at`` and the other times are floats comparable exactly like SQLite's. Not ``now()``:
  that is the start of the transaction, and a claim that waited on a row lock would judge the
  lease at a stale time and grant a lease shorter than asked.
* **Concurrency** is READ COMMITTED. The claim and the commit are each one ``UPDATE ... WHERE ...
  RETURNING``: when two transactions race for a row, the second waits for the first's row lock
  and then re-evaluates its ``WHERE`` on the new row version, where ``state_version`` no longer
  matches, so exactly one wins. Where SQLite reads and then writes inside one ``BEGIN
  IMMEDIATE`` (writers serialised), this backend locks the rows it reads (``FOR UPDATE``) so the
  read-then-write is just as atomic.
* **A stopped process must not hold locks forever.** The harness pauses a worker with SIGSTOP,
  and its heartbeat thread may be stopped inside a transaction, holding its step's row lock; a
  worker that then claims the step would wait for as long as the pause lasts, and the harness
  waits for that worker. So every connection a worker opens sets
  ``idle_in_transaction_session_timeout``: the server ends such a session after
  ``idle_tx_timeout_ms`` and releases its locks, as a production server configured against stalled
  clients would. (SQLite has no such remedy: there the stopped transaction holds the whole database
  until ``busy_timeout``.) Not the connections of the process that made the handle (the harness): it
  is never stopped and its reads lock no rows, while a stall of its own -- a long garbage
  collection, a starved CPU -- between a read and its COMMIT must not end its session, which would
  end the run as an infrastructure failure that never happened.
* **Event order.** The history orders store events by their ``t`` (``CLOCK_MONOTONIC``, taken in
  the process that writes the event). SQLite serialises every write, so ``t`` order is commit
  order. Here each event is written while its transaction holds the lock on its step's row, so
  events of one step still get ``t`` in the order their changes commit, and an event never
  reports a row version older than an event before it. (Without that, a rejected commit read a
  lease version that a concurrent, not yet committed claim had already replaced, and the history
  showed the claim's fence going back: a false ``stale_writes_rejected`` violation.)
* **Connection faults.** A connection that dies inside a method is dropped (the next call opens a
  new one) and reported by what it means for the transaction: :class:`StoreUnavailable` when COMMIT
  was never sent (certainly rolled back), :class:`OutcomeUnknown` when it died after COMMIT was
  sent and before the answer was read (it may have committed). So COMMIT is sent through libpq's
  own calls, and every write transaction passes two crash points of its own, ``before_db_commit``
  and ``in_db_commit`` (COMMIT sent, answer unread), where the harness's ``terminate`` ends the
  worker's sessions (:meth:`PostgresStore.terminate_backends`). Reads and the heartbeat thread do
  not pass them: the failpoints belong to the process, and a fault meant for the worker's step must
  not land in whichever thread gets there first.

One module, a little over 500 lines, on purpose: a seventh of it is this docstring, the rules the
code below is held to, and they stay beside it.
"""

from __future__ import annotations

import math
import os
import re
import select
import time
from typing import Any, Callable, Iterable, Mapping, TypeVar
from urllib.parse import quote

import psycopg
from psycopg import conninfo, pq

from killpoint import chaos
from killpoint import vocab
from killpoint.harness import states
from killpoint.harness.redact import redact
from killpoint.harness.store.base import Claim, OutcomeUnknown, StoreError, StoreUnavailable
from killpoint.harness.store.sql import SqlStore, event_args

T = TypeVar("T")

# Database time as epoch seconds, a float like SQLite's julianday arithmetic.
NOW = "extract(epoch from clock_timestamp())::double precision"

# Invariant: every schema a run creates starts with this, so leftovers can be found and dropped.
from killpoint.harness.store.base import SCHEMA_PREFIX as SCHEMA_PREFIX  # noqa: E402  (re-exported)
_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

SCHEMA = """
CREATE SCHEMA {s};
CREATE TABLE {s}.clock (
    offset_s double precision NOT NULL
);
INSERT INTO {s}.clock (offset_s) VALUES (0);
CREATE TABLE {s}.instances (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    format_version INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    data TEXT NOT NULL,
    integrity TEXT NOT NULL
);
CREATE TABLE {s}.steps (
    instance TEXT NOT NULL,
    step TEXT NOT NULL,
    idx INTEGER NOT NULL,
    state TEXT NOT NULL,
    state_version INTEGER NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    owner_worker TEXT,
    lease_version INTEGER NOT NULL DEFAULT 0,
    expires_at DOUBLE PRECISION,
    heartbeat_at DOUBLE PRECISION,
    progress_at DOUBLE PRECISION,
    PRIMARY KEY (instance, step)
);
CREATE TABLE {s}.receipts (
    key TEXT PRIMARY KEY,
    instance TEXT NOT NULL,
    step TEXT NOT NULL,
    intent_hash TEXT,
    status TEXT NOT NULL,
    response TEXT NOT NULL
);
CREATE TABLE {s}.events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    t BIGINT NOT NULL,
    db_time DOUBLE PRECISION NOT NULL,
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
    data TEXT NOT NULL DEFAULT '{{}}'
);
"""


# How long any one wait on the server may last, in real seconds, unless the run says otherwise
# (:attr:`killpoint.harness.run.RunConfig.io_bound_s`): connecting, a statement's answer, COMMIT's.
IO_TIMEOUT_S = 10.0


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within the connection's bound (sockets open, no bytes: a network
    partition, a frozen proxy, a stalled server). No SQLSTATE: the server never said anything."""


class _Bounded(psycopg.Connection[Any]):
    """A connection whose every wait on the server is bounded: psycopg waits for an answer as long
    as it takes, and a frozen peer that keeps the socket open (a proxy, a partition that drops
    nothing the kernel sees) would hold the run for ever."""

    io_timeout_s: float = IO_TIMEOUT_S
    peer: str = "the PostgreSQL server"

    def wait(self, gen: Any, interval: float | None = None, timeout: float | None = None) -> Any:
        bound = self.io_timeout_s if timeout is None else timeout
        kw: dict[str, Any] = {} if interval is None else {"interval": interval}
        try:
            return super().wait(gen, timeout=bound, **kw)
        except psycopg.OperationalError as exc:
            if timeout is None and type(exc).__name__ == "_WaitTimeout":  # psycopg's own, private
                raise NoAnswer(f"no answer from {self.peer} for {bound:g} s") from exc
            raise


def peer(dsn: str) -> str:
    """Where ``dsn`` points, as a message names it (host and port, never the password)."""
    try:
        params = conninfo.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "the PostgreSQL server"
    host = str(params.get("host") or params.get("hostaddr") or "the local socket")
    return f"the PostgreSQL server at {host}:{params.get('port') or 5432}"


def bounds(dsn: str, io_timeout_s: float = IO_TIMEOUT_S) -> dict[str, Any]:
    """The libpq parameters that bound a connection's waits, each unless the DSN sets it:
    ``connect_timeout``; TCP keepalives and ``tcp_user_timeout``, which end a connection whose
    peer has gone silent on the network (packets unacknowledged) even while nothing waits on it;
    and the server's ``statement_timeout``, so that a statement cut short here does not go on
    there holding its locks."""
    given = conninfo.conninfo_to_dict(dsn)
    whole = max(1, math.ceil(io_timeout_s))
    wanted: dict[str, Any] = {"connect_timeout": whole, "keepalives": 1,
                              "keepalives_idle": max(1, whole // 3), "keepalives_interval": max(1, whole // 6),
                              "keepalives_count": 3, "tcp_user_timeout": whole * 1000}
    kw = {k: v for k, v in wanted.items() if k not in given}
    options = str(given.get("options") or "")
    if "statement_timeout" not in options:
        kw["options"] = f"{options} -c statement_timeout={whole * 1000}".strip()
    return kw


def connect(dsn: str, io_timeout_s: float = IO_TIMEOUT_S, **kw: Any) -> psycopg.Connection[Any]:
    """A plain connection (autocommit off) whose waits are bounded (:func:`bounds`): connecting,
    and each answer of the server, within ``io_timeout_s`` real seconds, else :class:`NoAnswer`."""
    for key, value in bounds(dsn, io_timeout_s).items():
        kw.setdefault(key, value)
    conn = _Bounded.connect(dsn, autocommit=kw.pop("autocommit", False), **kw)
    conn.io_timeout_s = io_timeout_s
    conn.peer = peer(dsn)
    return conn


def _operation(fn: Callable[..., Any]) -> str:
    """The store method a transaction's function was written in (``instance()`` for a lambda in
    ``SqlStore.instance``), to name what was waiting."""
    name = getattr(fn, "__qualname__", "") or getattr(fn, "__name__", "")
    outer = name.split(".<locals>", 1)[0].rsplit(".", 1)[-1]
    return f"{outer}()" if outer and not outer.startswith("<") else "a transaction"


def _reason(exc: BaseException) -> str:
    """The first line of a driver error, for a one-line message."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _client_side(exc: BaseException) -> bool:
    """An error of the client's own (no SQLSTATE: the server never answered), such as psycopg's
    "connection socket closed" when the socket hangs up before libpq has read the server's last
    words: the connection is lost even while libpq's status still reads OK. Every error the
    server sends (a refusal, a serialization failure) carries a SQLSTATE."""
    return isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None


class PostgresStore(SqlStore):
    """One run's store: the tables of :mod:`harness.store.sqlite` in a schema of their own."""

    NOW = NOW
    LOCK = " FOR UPDATE"
    SKIP_LOCKED = " FOR UPDATE SKIP LOCKED"
    PARAM = "%s"

    def __init__(self, dsn: str, schema: str, *, idle_tx_timeout_ms: int = 1000,
                 io_timeout_s: float = IO_TIMEOUT_S):
        if not _IDENT.match(schema):
            raise ValueError(f"schema {schema!r}: use a lowercase identifier of at most 63 characters")
        self.dsn = dsn
        self.schema = schema
        # Far above any of our transactions (sub-millisecond), far below a run's bound.
        self.idle_tx_timeout_ms = idle_tx_timeout_ms
        # The most any one wait on the server lasts (connect, an answer, COMMIT's), in real seconds.
        self.io_timeout_s = io_timeout_s
        self._s = f'"{schema}"'  # safe to format into SQL: checked against _IDENT above
        self._conn: psycopg.Connection[Any] | None = None
        self._inherited: psycopg.Connection[Any] | None = None
        self._pid = -1
        self._maker = os.getpid()  # the harness: its sessions get no idle-in-transaction timeout
        # Handles made by clone() in this process: a terminate ends the worker's every session.
        self._clones: list[PostgresStore] = []
        self._committing = False  # COMMIT sent and its answer not read yet
        self.silent: str | None = None  # why the server was found silent in this process, if it was
        # Whether this handle ever sent its schema's CREATE: a run whose setup never reached the
        # server (it was refused or silent while connecting) has no schema to drop, and dropping it
        # would wait out another I/O bound for nothing.
        self._setup_sent = False

    @property
    def url(self) -> str:
        """A libpq URL (password redacted) whose search_path is this run's schema."""
        sep = "&" if "?" in self.dsn else "?"
        return f"{redact(self.dsn)}{sep}options={quote('-csearch_path=' + self.schema)}"

    def __getstate__(self) -> dict[str, Any]:
        # A connection cannot cross a process boundary: the receiving process opens its own.
        return {**self.__dict__, "_conn": None, "_inherited": None, "_pid": -1, "_clones": [],
                "_committing": False}

    @property
    def application_name(self) -> str:
        """The name every connection of this run sets: what :meth:`terminate_backends` matches on."""
        return f"killpoint {self.schema}"[:63]

    # -- connection -------------------------------------------------------------------------------
    def conn(self) -> psycopg.Connection[Any]:
        # Invariant: a connection is only used by the process that opened it. A broken one (the
        # server ended it) is replaced, as a fresh process would do.
        if self._conn is None or self._pid != os.getpid() or self._conn.closed:
            if self._conn is not None and self._pid != os.getpid():
                # Inherited through fork: keep it referenced and unused. psycopg never sends a
                # termination from a process that did not open the connection, but dropping it
                # would still warn about an unclosed connection.
                self._inherited = self._conn
            c = connect(self.dsn, self.io_timeout_s, application_name=self.application_name, autocommit=True)
            if os.getpid() != self._maker:  # a worker, which the harness may stop (SIGSTOP)
                # Outside a transaction: a stall here must not meet the timeout it sets.
                c.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                          (str(int(self.idle_tx_timeout_ms)),))
            c.autocommit = False
            self._conn, self._pid = c, os.getpid()
        return self._conn

    def clone(self) -> "PostgresStore":
        """A handle with a connection of its own (for the heartbeat thread)."""
        other = PostgresStore(self.dsn, self.schema, idle_tx_timeout_ms=self.idle_tx_timeout_ms,
                              io_timeout_s=self.io_timeout_s)
        other._maker = self._maker  # a worker's heartbeat handle is a worker's
        self._clones.append(other)
        return other

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    def drop(self) -> None:
        """Drop the run's schema and everything in it (from a fresh autocommit connection); refused
        at once when the server already gave no answer in this process (another wait as long
        would only delay saying so)."""
        self.close()
        if not self._setup_sent:
            return
        if self.silent is not None and self._pid == os.getpid():
            raise StoreUnavailable(self.silent)
        with connect(self.dsn, self.io_timeout_s, autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {self._s} CASCADE")

    def _write(self, fn: Callable[[psycopg.Cursor[Any]], T], *, points: bool = True) -> T:
        """Run ``fn`` in one transaction: committed if it returns, rolled back if it raises.

        A dead connection raises :class:`StoreUnavailable` or :class:`OutcomeUnknown` (see the
        module's "Connection faults") and is dropped. ``points``: pass the db crash points.
        """
        asked = time.monotonic()
        try:
            c = self.conn()
        except psycopg.OperationalError as exc:
            why = f"cannot connect to {peer(self.dsn)} in {_operation(fn)}: {_reason(exc)}"
            if time.monotonic() - asked >= self.io_timeout_s * 0.9:  # silent, not refusing
                why = self.silent = (f"no answer from {peer(self.dsn)} for {self.io_timeout_s:g} s while "
                                     f"connecting in {_operation(fn)} (a network partition or a stalled server)")
            raise StoreUnavailable(why) from exc
        try:
            with c.cursor() as cur:
                result = fn(cur)
            if points:
                chaos.point("before_db_commit")
        except BaseException as exc:
            if isinstance(exc, NoAnswer):  # the connection is in no known state: drop it unread
                self._lose(c)
                self.silent = f"{exc} in {_operation(fn)} (a network partition or a stalled server)"
                raise StoreUnavailable(f"{self.silent}; the transaction was not committed") from exc
            try:
                c.rollback()
            except psycopg.Error:
                pass  # the connection is gone; the server rolls back on its own
            if isinstance(exc, psycopg.Error) and (c.closed or _client_side(exc)):  # lost, not refused
                self._lose(c)
                raise StoreUnavailable(f"the connection to the store died before COMMIT: "
                                       f"{_reason(exc)}") from exc
            raise
        self._commit(c, points, fn)
        return result

    def _read(self, fn: Callable[[psycopg.Cursor[Any]], T]) -> T:
        """A read is a transaction too (it must not stay open), without the db crash points."""
        return self._write(fn, points=False)

    def _commit(self, c: psycopg.Connection[Any], points: bool, fn: Callable[..., Any]) -> None:
        """COMMIT with libpq's own calls, so that ``in_db_commit`` sits between sending it and
        reading its answer, and a connection lost on the way is told apart by when it was lost."""
        pg = c.pgconn
        if select.select([pg.socket], [], [], 0)[0]:
            # In a transaction, between statements, the server speaks unasked only to end the
            # session (nothing here LISTENs): the transaction is lost and COMMIT was never sent.
            self._lose(c)
            raise StoreUnavailable("the store ended the session before COMMIT; the transaction "
                                   "was rolled back")
        deadline = time.monotonic() + self.io_timeout_s

        def silent(when: str) -> OutcomeUnknown:
            self._lose(c)
            self.silent = (f"no answer from {peer(self.dsn)} for {self.io_timeout_s:g} s {when} "
                           f"in {_operation(fn)} (a network partition or a stalled server)")
            return OutcomeUnknown(self.silent)
        try:
            pg.send_query(b"COMMIT")
            while pg.flush():  # the connection is non-blocking: 1 while bytes are left to write
                if not select.select([], [pg.socket], [], max(0.0, deadline - time.monotonic()))[1]:
                    raise silent("while sending COMMIT")
        except psycopg.Error as exc:
            self._lose(c)
            raise OutcomeUnknown(f"the connection to the store died while sending COMMIT: "
                                 f"{_reason(exc)}") from exc
        self._committing = True
        try:
            action = chaos.point("in_db_commit") if points else None
        finally:
            self._committing = False
        if action == "terminate":
            # The harness ended the session once the server had processed the COMMIT (it waits
            # for that), so the transaction committed. A real cut loses the answer in flight with
            # the connection; pg_terminate_backend alone cannot (the server flushes its answer
            # before it exits), so our end drops the answer unread, as the cut would have.
            self._lose(c)
            raise OutcomeUnknown("the connection to the store was cut after COMMIT was sent; "
                                 "its answer was lost")
        try:
            deadline = time.monotonic() + self.io_timeout_s  # from the end of a pause at in_db_commit
            while True:
                pg.consume_input()
                if not pg.is_busy():
                    break
                if not select.select([pg.socket], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    raise silent("after COMMIT was sent")
            results = []
            while (r := pg.get_result()) is not None:
                results.append(r)
        except psycopg.Error as exc:
            self._lose(c)
            raise OutcomeUnknown(f"the connection to the store died before COMMIT's answer: "
                                 f"{_reason(exc)}") from exc
        failed = [r for r in results if r.status != pq.ExecStatus.COMMAND_OK]
        if not results or failed:
            why = failed[0].error_message.decode(errors="replace").strip() if failed else "no answer"
            severity = failed[0].error_field(pq.DiagnosticField.SEVERITY_NONLOCALIZED) if failed else None
            if not failed or severity in (b"FATAL", b"PANIC") or pg.status != pq.ConnStatus.OK:
                self._lose(c)  # the session ended as it answered: it may have committed first
                raise OutcomeUnknown(f"the store ended the session in answer to COMMIT: {why}")
            raise StoreError(f"COMMIT failed, the transaction was rolled back: {why}")

    def _lose(self, c: psycopg.Connection[Any]) -> None:
        """Drop a dead (or cut) connection without reading anything more from it; the next call
        opens a new one."""
        if self._conn is c:
            self._conn = None
        try:
            c.close()
        except psycopg.Error:
            pass

    # -- connection faults (the harness's side) ------------------------------------------------
    def backends(self) -> dict[str, list[int]]:
        """The server sessions this process holds for this run through this handle and its clones
        (``backend_pids``, this handle's first), and those with a COMMIT in flight (``await_idle``)."""
        pids: list[int] = []
        awaiting: list[int] = []
        for handle in (self, *self._clones):
            c = handle._conn
            if c is None or handle._pid != os.getpid() or c.closed:
                continue
            pids.append(c.info.backend_pid)
            if handle._committing:
                awaiting.append(c.info.backend_pid)
        return {"backend_pids": pids, "await_idle": awaiting}

    def terminate_backends(self, pids: Iterable[int], *, await_idle: Iterable[int] = (),
                           timeout_s: float = 10.0) -> dict[str, Any]:
        """End server sessions of this run (``pg_terminate_backend``), from a connection of our own.

        Only sessions of this run are touched, matched on :attr:`application_name`, whatever PIDs
        are asked. A session in ``await_idle`` has a COMMIT in flight: it is ended only once the
        server shows it ``idle``, the COMMIT processed and the transaction committed, so what its
        worker cannot learn is a definite commit rather than a race. Then waits until every
        ended session has left ``pg_stat_activity``, so that the worker's next call meets a dead
        connection. Returns the PIDs ended and the state each was in when it was ended.
        """
        pids = [int(p) for p in pids]
        awaiting = [int(p) for p in await_idle]
        deadline = time.monotonic() + timeout_s
        query = ("SELECT pid, state FROM pg_stat_activity WHERE pid = ANY(%s) AND application_name = %s")
        with connect(self.dsn, self.io_timeout_s, autocommit=True) as admin:
            def sessions() -> dict[int, str | None]:
                return dict(admin.execute(query, (pids, self.application_name)).fetchall())

            seen = sessions()
            while any(seen.get(p, "idle") != "idle" for p in awaiting):
                if "disabled" in seen.values():
                    raise StoreError("track_activities is off on the server, so pg_stat_activity cannot "
                                     "show when a COMMIT in flight has been processed")
                if time.monotonic() > deadline:
                    raise StoreError(f"backend {awaiting} did not finish its COMMIT within {timeout_s:g} s")
                time.sleep(0.001)
                seen = sessions()
            ended = [pid for pid, ok in admin.execute(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid = ANY(%s) AND application_name = %s", (pids, self.application_name)) if ok]
            while set(sessions()) & set(ended):
                if time.monotonic() > deadline:
                    raise StoreError(f"backend {ended} still running {timeout_s:g} s after "
                                     f"pg_terminate_backend")
                time.sleep(0.001)
        return {"backend_pids": ended, "states": {str(p): seen.get(p) for p in ended}}

    def _tables(self) -> dict[str, str]:
        return {t: f"{self._s}.{t}" for t in ("steps", "receipts", "events", "instances", "clock")}

    # -- set-up and reading -----------------------------------------------------------------------
    def setup(self, instances: Iterable[Mapping[str, Any]]) -> None:
        """Create the schema and its tables and insert the instances, all in one transaction."""
        s = self._s

        def do(cur: psycopg.Cursor[Any]) -> None:
            self._setup_sent = True
            cur.execute(SCHEMA.format(s=s))
            inst_rows, step_rows, event_rows = [], [], []
            for seq, inst in enumerate(instances):
                inst_rows.append((inst["id"], seq, inst["format_version"], inst["fingerprint"],
                                  inst["data"], inst["integrity"]))
                for idx, step in enumerate(inst["steps"]):
                    step_rows.append((inst["id"], step, idx, states.PENDING))
                    event_rows.append(event_args(vocab.CREATED, inst["id"], step, to_state=states.PENDING,
                                                 state_version=1, lease_version=0, attempt=0))
            cur.executemany(f"INSERT INTO {s}.instances (id, seq, format_version, fingerprint, data, "
                            f"integrity) VALUES (%s, %s, %s, %s, %s, %s)", inst_rows)
            cur.executemany(f"INSERT INTO {s}.steps (instance, step, idx, state, state_version) "
                            f"VALUES (%s, %s, %s, %s, 1)", step_rows)
            cur.executemany(self._event_sql(), event_rows)
        self._write(do)

    def heartbeat(self, claim: Claim, ttl_ms: float) -> bool:
        """Extend the lease, only while it is still ours (same fence, same owner).

        A lost connection answers ``False``: we cannot know the lease is still ours (even a COMMIT
        whose answer was lost may or may not have landed), and the heartbeat thread must not die
        of it. The next call opens a new connection.
        """
        try:
            return super().heartbeat(claim, ttl_ms)
        except StoreUnavailable:
            return False  # lost, and maybe even committed: either way we cannot count on the lease
        except psycopg.Error as exc:
            # The server ending an idle transaction raises IdleInTransactionSessionTimeout (not an
            # OperationalError); what matters is whether the connection is gone or failing.
            if isinstance(exc, psycopg.OperationalError) or self._conn is None or self._conn.closed:
                return False
            raise
