"""Durable stores: SQLite (embedded default, one file per run) and PostgreSQL (a schema per run)."""

from __future__ import annotations

import os
import re
import secrets

from killpoint.errors import shown
from killpoint.errors import InvalidStore, OutcomeUnknown, StoreError, StoreUnavailable, StoreUnreachable
from killpoint.harness.store.base import Claim, Store
from killpoint.harness.redact import redact
from killpoint.harness.store.sqlite import SQLiteStore

_PG_SCHEMES = ("postgresql://", "postgres://")


def schema_name(run_id: str, pid: int | None = None) -> str:
    """A fresh schema name for one run: prefix, run id, creating PID and a random suffix.

    Run ids repeat across sessions and pytest-xdist workers run at once on one server, so the run
    id alone would collide; the PID (which lets a process find the schemas it made) and a random
    suffix make the name unique. Lowercase letters, digits and ``_`` only, at most 63 characters.
    """
    from killpoint.harness.store.base import SCHEMA_PREFIX

    tail = f"_p{os.getpid() if pid is None else pid}_{secrets.token_hex(3)}"
    slug = re.sub(r"[^a-z0-9_]+", "_", run_id.lower()).strip("_") or "run"
    return f"{SCHEMA_PREFIX}{slug[:63 - len(SCHEMA_PREFIX) - len(tail)]}{tail}"


def open_store(spec: str, run_dir: str, run_id: str, *, io_timeout_s: float | None = None) -> Store:
    """``sqlite`` (a file in the run's folder) or a ``postgresql://`` URL (a fresh schema), whose
    every wait on the server lasts at most ``io_timeout_s`` real seconds (None: the default,
    :data:`killpoint.harness.store.postgres.IO_TIMEOUT_S`)."""
    if spec in ("sqlite", "", None):
        return SQLiteStore(os.path.join(run_dir, f"{run_id}.sqlite"), harness_pid=os.getpid())
    if spec.startswith(_PG_SCHEMES):
        from killpoint.harness.store.postgres import PostgresStore

        if io_timeout_s is None:
            return PostgresStore(spec, schema_name(run_id))
        return PostgresStore(spec, schema_name(run_id), io_timeout_s=io_timeout_s)
    raise InvalidStore(f"--store {shown(redact(spec))}: expected 'sqlite' or a postgresql:// URL")


def check_store(spec: str) -> None:
    """Refuse a --store value we cannot use, with one line naming it (before any run starts).

    For PostgreSQL this connects once, with a 2 s bound, so an unreachable server is reported as
    such, naming host and port, instead of as a crash of the first worker. A server that answered
    and refused us (no such role or database, a wrong password) is a value we cannot use:
    :class:`InvalidStore`. One that did not answer at all (the connection refused, timed out, no
    route) is the infrastructure's failure, as a store lost mid-run is: :class:`StoreUnreachable`.
    """
    if spec in ("sqlite", "", None):
        return
    if not spec.startswith(_PG_SCHEMES):
        raise InvalidStore(f"--store {shown(redact(spec))}: expected 'sqlite' or a postgresql:// URL")
    import psycopg
    from psycopg import conninfo

    named = shown(redact(spec))
    try:
        params = conninfo.conninfo_to_dict(spec)
    except psycopg.Error as exc:
        raise InvalidStore(f"--store {named}: not a valid PostgreSQL URL ({redact(_first_line(exc))})") from None
    where = f"{params.get('host') or 'the local socket'}:{params.get('port') or 5432}"
    try:
        with psycopg.connect(spec, connect_timeout=2, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        reason = redact(_first_line(exc))
        line = f"--store {named}: cannot connect to {where} ({reason})"
        if any(words in reason.lower() for words in _UNREACHABLE):
            raise StoreUnreachable(line) from None
        raise InvalidStore(line) from None


# libpq's words for a server that never answered (as opposed to one that answered and refused us).
_UNREACHABLE = ("connection refused", "timeout expired", "timed out", "no route to host",
                "network is unreachable", "server closed the connection unexpectedly",
                "no such file or directory")  # the last: no server on that Unix socket


def check_faults(spec: str | None, schedule) -> None:
    """Refuse, in one line naming the store, a fault that only a PostgreSQL store can carry out.

    ``terminate`` ends a worker's server sessions and the db crash points sit inside the PostgreSQL
    store's COMMIT; SQLite has neither, so such a fault could never fire and the run could only end
    unjudged. Refused before any run starts instead.
    """
    from killpoint.chaos.points import DB_POINTS

    if schedule is None or str(spec or "").startswith(_PG_SCHEMES):
        return
    for fault in schedule.faults:
        if any(term.action == "terminate" for term in fault.actions.terms):
            raise InvalidStore(f"--store {shown(redact(spec or 'sqlite'))}: fault {str(fault)!r} terminates the "
                               f"worker's database backend, which only a postgresql:// store has")
        if fault.point in DB_POINTS:
            raise InvalidStore(f"--store {shown(redact(spec or 'sqlite'))}: fault {str(fault)!r} is at "
                               f"{fault.point}, a crash point inside the PostgreSQL store's COMMIT; "
                               f"use a postgresql:// store")


def _first_line(exc: BaseException) -> str:
    """libpq's reason, without the server address it repeats or the hints on later lines."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.rsplit(" failed: ", 1)[-1]  # 'connection to server at "h", port p failed: why'
    text = re.sub(r"^(FATAL|ERROR):\s+", "", text)
    return (text[:1].lower() + text[1:]).rstrip(".") if text else type(exc).__name__


__all__ = ["check_faults", "check_store", "Claim", "InvalidStore", "OutcomeUnknown", "SQLiteStore", "Store",
           "StoreError", "StoreUnavailable", "StoreUnreachable", "open_store",
           "schema_name"]
