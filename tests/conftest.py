"""Shared fixtures: where the PostgreSQL tests find their server.

``KILLPOINT_PG_DSN`` names the server (default: the local one, trust auth, database ``test``).
Without a reachable server the PostgreSQL tests skip and say how to point them at one; with
``KILLPOINT_REQUIRE_PG=1`` (CI sets it) they fail instead, so CI can never go green by skipping.
"""

from __future__ import annotations

import os
import signal

import pytest

DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def _signals_at_their_defaults() -> None:
    """The suite's commands start with SIGINT, SIGHUP and SIGTERM at their defaults, however the suite
    was launched. A shell without job control starts a background job with SIGINT ignored (``nohup``
    ignores SIGHUP too), every command the tests start would inherit that, and killpoint keeps an
    ignored signal ignored (tests/test_infrastructure.py protects that): the tests that send a Ctrl-C
    would then wait for an exit that never comes. A CI runner starts its jobs with the defaults."""
    for signum, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL),
                            (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, handler)


_signals_at_their_defaults()


def live_children() -> set[int]:
    """This process's children now, read from /proc (zombies included: an unreaped child shows)."""
    me, found = str(os.getpid()), set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[1] == me:
                    found.add(int(pid))
        except (OSError, IndexError):
            pass
    return found


@pytest.fixture
def children():
    """:func:`live_children`, to compare before and after: another test's session (the plugin's)
    may keep a downstream alive, so "no child at all" is never the test."""
    return live_children


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    """The DSN of a reachable PostgreSQL server, or a skip (a failure when it is required)."""
    from killpoint.harness.store import InvalidStore, check_store

    dsn = os.environ.get("KILLPOINT_PG_DSN") or DEFAULT_PG_DSN
    try:
        check_store(dsn)
    except InvalidStore as exc:
        if os.environ.get("KILLPOINT_REQUIRE_PG") == "1":
            pytest.fail(f"KILLPOINT_REQUIRE_PG=1 but PostgreSQL is unreachable: {exc}", pytrace=False)
        pytest.skip(f"no PostgreSQL server ({exc}); set KILLPOINT_PG_DSN=postgresql://user@host:port/db "
                    f"to run these tests against one")
    return dsn
