"""The fake downstream: a real HTTP service with idempotency keys, fencing tokens and a ledger.

The server runs in its own OS process on ``127.0.0.1`` and an ephemeral port, forked from the
caller with :func:`start`. It keeps everything in one SQLite file (WAL), so a new process on the
same file -- :meth:`DownstreamProcess.restart` -- sees every earlier key, receipt and fence. One
server serves many runs at once; each run is isolated by the run id in the URL path.

Semantics follow the Idempotency-Key header draft and Stripe. For ``POST /runs/{run}/resources/{r}``
the rules are applied in this order:

1. fencing resource, ``Fencing-Token`` lower than the highest seen for ``(run, scope)`` → 409
   ``stale_fence``, no effect (equal passes; a higher one becomes the highest seen);
2. keyed (non-legacy) resource without ``Idempotency-Key`` → 400 ``missing_key``;
3. key known and still being processed → 409 ``in_flight``;
4. key known, finished, same resource and intent hash → the stored answer again, with
   ``"replay": true`` and the header ``Idempotent-Replayed: true``; no new effect;
5. key known, other intent (or other resource) → 422 ``intent_conflict``, never the old result
   (config ``ignore_intent`` turns this into a replay of the old result: a deliberate mutant);
6. otherwise (a new key; a legacy resource always) the request is applied: ``"card": "declined"``
   in the parameters answers 402 and stores that outcome for the key, anything else applies one
   effect and answers 200.

Injected faults only touch requests that reach rule 6 (the apply path): ``status:N`` answers N with
no effect and no stored key (a retry is a fresh attempt); ``latency:MS`` marks the key in flight and
sleeps; ``drop`` applies and stores the outcome as usual, then closes the connection without an
answer (ledger outcome ``dropped``; ``applied`` stays the truth: false for a declined card).

Every resource request, whatever its outcome, is one ledger row, committed before the answer is
sent: the ledger is the ground truth the checkers trust (see :mod:`harness.history`).
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import http.client
import json
import os
import select
import signal
import socket
import sqlite3
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping
from urllib.parse import quote, unquote, urlsplit

from killpoint.harness.intent import intent_hash
from killpoint.harness.signals import sigint_deferred, unblock_sigint

__all__ = ["Answer", "DownstreamClient", "DownstreamProcess", "LostResponse", "start",
           "DEFAULT_RESOURCE", "OUTCOMES"]

DEFAULT_RESOURCE: Mapping[str, bool] = {"legacy": False, "fencing": True}
OUTCOMES = frozenset({"applied", "declined", "replay", "conflict", "in_flight", "missing_key",
                      "stale_fence", "error", "dropped"})

_START_TIMEOUT = 10.0
_PR_SET_PDEATHSIG = 1

# --------------------------------------------------------------------------------------- server

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    run TEXT NOT NULL, seq INTEGER NOT NULL, t INTEGER NOT NULL, resource TEXT NOT NULL,
    key TEXT, scope TEXT, fence INTEGER, intent_hash TEXT, params TEXT NOT NULL,
    meta TEXT NOT NULL, status INTEGER NOT NULL, outcome TEXT NOT NULL, applied INTEGER NOT NULL,
    PRIMARY KEY (run, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS keys (
    run TEXT NOT NULL, key TEXT NOT NULL, resource TEXT NOT NULL, intent_hash TEXT NOT NULL,
    state TEXT NOT NULL, status INTEGER, response TEXT,
    PRIMARY KEY (run, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fences (
    run TEXT NOT NULL, scope TEXT NOT NULL, highest INTEGER NOT NULL,
    PRIMARY KEY (run, scope)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS config (
    run TEXT PRIMARY KEY, config TEXT NOT NULL) WITHOUT ROWID;
"""


class _BadRequest(Exception):
    pass


@dataclass
class _Reply:
    status: int
    body: dict[str, Any] | None
    headers: tuple[tuple[str, str], ...] = ()
    drop: bool = False


def _normalize_config(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _BadRequest("config must be a JSON object")
    resources: dict[str, dict[str, bool]] = {}
    for name, spec in (raw.get("resources") or {}).items():
        if not isinstance(spec, dict):
            raise _BadRequest(f"resource {name!r}: expected an object")
        resources[str(name)] = {"legacy": bool(spec.get("legacy", DEFAULT_RESOURCE["legacy"])),
                                "fencing": bool(spec.get("fencing", DEFAULT_RESOURCE["fencing"]))}
    faults: list[dict[str, Any]] = []
    for f in raw.get("faults") or []:
        if not isinstance(f, dict):
            raise _BadRequest("fault: expected an object")
        action = f.get("action")
        _parse_action(action)
        faults.append({"key": f.get("key"), "instance": f.get("instance"), "step": f.get("step"),
                       "action": action, "times": int(f.get("times", 1))})
    return {"resources": resources, "faults": faults,
            "ignore_intent": bool(raw.get("ignore_intent", False))}


def _parse_action(action: Any) -> tuple[str, int]:
    """Parse a fault action: ``drop``, ``status:503`` or ``latency:MS`` → (kind, number)."""
    if action == "drop":
        return "drop", 0
    if isinstance(action, str) and ":" in action:
        kind, _, arg = action.partition(":")
        if kind in ("status", "latency"):
            try:
                n = int(arg)
            except ValueError:
                raise _BadRequest(f"bad fault action {action!r}") from None
            if (kind == "status" and 100 <= n <= 599) or (kind == "latency" and n >= 0):
                return kind, n
    raise _BadRequest(f"bad fault action {action!r}")


class _Ledger:
    """The server's durable state. One connection, one lock; every method is one transaction."""

    def __init__(self, path: str) -> None:
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA busy_timeout=5000")
        self.db.executescript(_SCHEMA)
        # A key still in flight was left by a killed process: its effect was never applied (apply
        # and marking done are one transaction), so forget it and let a retry be a fresh attempt.
        self.db.execute("DELETE FROM keys WHERE state = 'in_flight'")
        self._configs: dict[str, dict[str, Any]] = {}
        self._seqs: dict[str, int] = {}

    # -- helpers (lock held) --

    def _config(self, run: str) -> dict[str, Any]:
        cfg = self._configs.get(run)
        if cfg is None:
            row = self.db.execute("SELECT config FROM config WHERE run = ?", (run,)).fetchone()
            cfg = json.loads(row[0]) if row else _normalize_config({})
            self._configs[run] = cfg
        return cfg

    def _next_seq(self, run: str) -> int:
        seq = self._seqs.get(run)
        if seq is None:
            seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM ledger WHERE run = ?",
                                  (run,)).fetchone()[0]
        seq += 1
        self._seqs[run] = seq
        return seq

    def _write_row(self, run: str, row: dict[str, Any], status: int, outcome: str,
                   applied: bool, seq: int | None = None) -> None:
        if seq is None:
            seq = self._next_seq(run)
        self.db.execute(
            "INSERT INTO ledger VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run, seq, time.monotonic_ns(), row["resource"], row["key"], row["scope"],
             row["fence"], row["intent_hash"], json.dumps(row["params"]), json.dumps(row["meta"]),
             status, outcome, int(applied)))

    def _begin(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def _commit(self) -> None:
        self.db.execute("COMMIT")

    def _rollback(self) -> None:
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")
        self._seqs.clear()  # counters may have run ahead of what was committed
        self._configs.clear()

    def _take_fault(self, run: str, cfg: dict[str, Any], key: str | None,
                    meta: Mapping[str, Any]) -> tuple[str, int] | None:
        for f in cfg["faults"]:
            if f["times"] <= 0:
                continue
            if f["key"] is not None:
                if f["key"] != key:
                    continue
            elif ((f["instance"] is not None and f["instance"] != meta.get("instance"))
                  or (f["step"] is not None and f["step"] != meta.get("step"))):
                continue
            f["times"] -= 1
            self.db.execute("UPDATE config SET config = ? WHERE run = ?", (json.dumps(cfg), run))
            return _parse_action(f["action"])
        return None

    # -- requests --

    def configure(self, run: str, raw: Any) -> None:
        cfg = _normalize_config(raw)
        with self.lock:
            try:
                self._begin()
                self.db.execute("INSERT OR REPLACE INTO config VALUES (?, ?)",
                                (run, json.dumps(cfg)))
                self._commit()
            except BaseException:
                self._rollback()
                raise
            self._configs[run] = cfg

    def raise_fence(self, run: str, scope: str, fence: int) -> None:
        """A recovering lease holder shows its fence without calling, so that an older holder's late
        call is refused even when the new holder settles the step without a call of its own."""
        with self.lock:
            self._begin()
            try:
                self.db.execute("INSERT INTO fences VALUES (?, ?, ?) ON CONFLICT (run, scope) DO UPDATE "
                                "SET highest = MAX(highest, excluded.highest)", (run, scope, fence))
            except BaseException:
                self._rollback()
                raise
            self._commit()

    def receipt(self, run: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            row = self.db.execute(
                "SELECT intent_hash, status, response FROM keys WHERE run = ? AND key = ? "
                "AND state = 'done'", (run, key)).fetchone()
        if row is None:
            return None
        return {"key": key, "intent_hash": row[0], "status": row[1], "response": json.loads(row[2])}

    def rows(self, run: str) -> list[dict[str, Any]]:
        with self.lock:
            found = self.db.execute(
                "SELECT t, seq, resource, key, scope, fence, intent_hash, params, meta, status, "
                "outcome, applied FROM ledger WHERE run = ? ORDER BY seq", (run,)).fetchall()
        return [{"t": t, "seq": seq, "resource": res, "key": key, "scope": scope, "fence": fence,
                 "intent_hash": ih, "params": json.loads(params), "meta": json.loads(meta),
                 "status": status, "outcome": outcome, "applied": bool(applied)}
                for (t, seq, res, key, scope, fence, ih, params, meta, status, outcome, applied)
                in found]

    def bad_request(self, run: str, resource: str, key: str | None, fence: int | None,
                    params: Any, meta: Any, why: str) -> _Reply:
        row = {"resource": resource, "key": key, "scope": None, "fence": fence,
               "intent_hash": None, "params": params, "meta": meta}
        with self.lock:
            try:
                self._begin()
                self._write_row(run, row, 400, "error", False)
                self._commit()
            except BaseException:
                self._rollback()
                raise
        return _Reply(400, {"error": "bad_request", "detail": why})

    def post(self, run: str, resource: str, key_header: str | None, fence: int | None,
             scope_header: str | None, params: dict[str, Any], meta: dict[str, Any]) -> _Reply:
        ih = intent_hash(params)
        delay_ms: int | None = None
        with self.lock:
            try:
                self._begin()
                reply, delay_ms, row, drop = self._decide(run, resource, key_header, fence,
                                                          scope_header, params, meta, ih)
                if reply is None and delay_ms is None:
                    reply = self._apply(run, row, drop)
                self._commit()
            except BaseException:
                self._rollback()
                raise
        if reply is not None:
            return reply
        time.sleep(delay_ms / 1000.0)  # the key is in flight; the lock is not held
        with self.lock:
            try:
                self._begin()
                reply = self._apply(run, row, drop)
                self._commit()
            except BaseException:
                self._rollback()
                if row["key"] is not None:  # do not leave the key wedged in flight
                    self.db.execute("DELETE FROM keys WHERE run = ? AND key = ? "
                                    "AND state = 'in_flight'", (run, row["key"]))
                raise
        return reply

    def _decide(self, run: str, resource: str, key_header: str | None, fence: int | None,
                scope_header: str | None, params: dict[str, Any], meta: dict[str, Any], ih: str
                ) -> tuple[_Reply | None, int | None, dict[str, Any], bool]:
        cfg = self._config(run)
        spec = cfg["resources"].get(resource, DEFAULT_RESOURCE)
        key = None if spec["legacy"] else key_header
        if scope_header:
            scope = scope_header
        elif key is not None:
            scope = key
        elif meta.get("instance") is not None or meta.get("step") is not None:
            scope = f"{meta.get('instance')}:{meta.get('step')}"
        else:
            scope = resource
        row = {"resource": resource, "key": key, "scope": scope, "fence": fence,
               "intent_hash": ih, "params": params, "meta": meta}

        def finish(status: int, body: dict[str, Any], outcome: str,
                   headers: tuple[tuple[str, str], ...] = ()) -> tuple[_Reply, None, dict, bool]:
            self._write_row(run, row, status, outcome, False)
            return _Reply(status, body, headers), None, row, False

        # 1. fencing
        if spec["fencing"] and fence is not None:
            got = self.db.execute("SELECT highest FROM fences WHERE run = ? AND scope = ?",
                                  (run, scope)).fetchone()
            if got is not None and fence < got[0]:
                return finish(409, {"error": "stale_fence", "highest": got[0]}, "stale_fence")
            if got is None or fence > got[0]:
                self.db.execute("INSERT OR REPLACE INTO fences VALUES (?, ?, ?)",
                                (run, scope, fence))
        # 2. a keyed resource needs a key
        if not spec["legacy"] and key is None:
            return finish(400, {"error": "missing_key"}, "missing_key")
        # 3-5. a known key
        if key is not None:
            known = self.db.execute(
                "SELECT resource, intent_hash, state, status, response FROM keys "
                "WHERE run = ? AND key = ?", (run, key)).fetchone()
            if known is not None:
                k_resource, k_hash, k_state, k_status, k_response = known
                if k_state == "in_flight":
                    return finish(409, {"error": "in_flight"}, "in_flight")
                if (k_resource == resource and k_hash == ih) or cfg["ignore_intent"]:
                    body = json.loads(k_response)
                    body["replay"] = True
                    return finish(k_status, body, "replay", (("Idempotent-Replayed", "true"),))
                return finish(422, {"error": "intent_conflict"}, "conflict")
        # 6. apply, unless a fault says otherwise
        drop = False
        fault = self._take_fault(run, cfg, key, meta)
        if fault is not None:
            kind, arg = fault
            if kind == "status":
                return finish(arg, {"error": "injected", "status": arg}, "error")
            if kind == "drop":
                drop = True
            elif kind == "latency":
                if key is not None:
                    self.db.execute("INSERT INTO keys VALUES (?, ?, ?, ?, 'in_flight', NULL, NULL)",
                                    (run, key, resource, ih))
                return None, arg, row, drop
        return None, None, row, drop

    def _apply(self, run: str, row: dict[str, Any], drop: bool) -> _Reply:
        seq = self._next_seq(run)
        key, ih = row["key"], row["intent_hash"]
        if row["params"].get("card") == "declined":
            status, applied, outcome = 402, False, "declined"
            body: dict[str, Any] = {"status": "declined", "key": key, "intent_hash": ih,
                                    "replay": False}
        else:
            status, applied, outcome = 200, True, "applied"
            body = {"status": "applied", "effect_id": f"eff-{seq}", "key": key,
                    "intent_hash": ih, "replay": False}
        if key is not None:
            self.db.execute("INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?, 'done', ?, ?)",
                            (run, key, row["resource"], ih, status, json.dumps(body)))
        self._write_row(run, row, status, "dropped" if drop else outcome, applied, seq=seq)
        return _Reply(status, body, drop=drop)


# What a plain HTTP client says about a request, as headers: the instance and step it is for (so the
# ledger can tell which logical intent an effect belongs to, whatever key was sent), who sent it and
# at which attempt. The body's "meta" object, killpoint's own client's way, wins over them.
META_HEADERS = {"Killpoint-Instance": "instance", "Killpoint-Step": "step",
                "Killpoint-Worker": "worker", "Killpoint-Attempt": "attempt"}


def _header_meta(headers: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for header, name in META_HEADERS.items():
        value = headers.get(header)
        if value in (None, ""):
            continue
        if name == "attempt":
            try:
                value = int(value)
            except ValueError:
                raise _BadRequest(f"{header} is not an integer: {value!r}") from None
        meta[name] = value
    return meta


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "killpoint-downstream"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise _BadRequest("body is not JSON") from None

    def _dispatch(self, method: str) -> None:
        try:
            reply = self._route(method)
        except _BadRequest as e:
            reply = _Reply(400, {"error": "bad_request", "detail": str(e)})
        except Exception as e:  # a bug: say so instead of hanging the client
            reply = _Reply(500, {"error": "internal", "detail": repr(e)})
        if reply.drop:
            self.close_connection = True  # the effect is applied; the answer is never sent
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self._send(reply)

    def _route(self, method: str) -> _Reply:
        ledger = self.server.ledger
        parts = [unquote(p) for p in self.path.split("?", 1)[0].split("/")[1:]]
        if method == "GET" and parts == ["health"]:
            return _Reply(200, {"ok": True, "pid": os.getpid()})
        if len(parts) < 3 or parts[0] != "runs":
            return _Reply(404, {"error": "not_found"})
        run, what, rest = parts[1], parts[2], parts[3:]
        if method == "PUT" and what == "config" and not rest:
            ledger.configure(run, self._body())
            return _Reply(204, None)
        if method == "GET" and what == "ledger" and not rest:
            return _Reply(200, {"rows": ledger.rows(run)})
        if method == "GET" and what == "receipts" and len(rest) == 1:
            token, scope = self.headers.get("Fencing-Token"), self.headers.get("Fencing-Scope")
            if token is not None and scope:
                try:
                    ledger.raise_fence(run, scope, int(token))
                except ValueError:
                    return _Reply(400, {"error": "bad_request",
                                        "detail": f"Fencing-Token is not an integer: {token!r}"})
            found = ledger.receipt(run, rest[0])
            return _Reply(200, found) if found else _Reply(404, {"error": "no_receipt"})
        if method == "POST" and what == "resources" and len(rest) == 1:
            return self._resource(run, rest[0])
        return _Reply(404, {"error": "not_found"})

    def _resource(self, run: str, resource: str) -> _Reply:
        ledger = self.server.ledger
        key = self.headers.get("Idempotency-Key") or None
        scope = self.headers.get("Fencing-Scope") or None
        token = self.headers.get("Fencing-Token")
        params: Any = {}
        meta: Any = {}
        fence: int | None = None
        try:
            if token not in (None, ""):
                try:
                    fence = int(token)
                except ValueError:
                    raise _BadRequest(f"Fencing-Token is not an integer: {token!r}") from None
            body = self._body()
            if not isinstance(body, dict):
                raise _BadRequest("body must be a JSON object")
            params = body.get("params", {})
            meta = body.get("meta") or {}
            if not isinstance(params, dict) or not isinstance(meta, dict):
                raise _BadRequest("params and meta must be JSON objects")
            meta = {**_header_meta(self.headers), **meta}
        except _BadRequest as e:
            return ledger.bad_request(run, resource, key, fence, params, meta, str(e))
        return ledger.post(run, resource, key, fence, scope, params, meta)

    def _send(self, reply: _Reply) -> None:
        data = b"" if reply.body is None else json.dumps(reply.body).encode()
        try:
            phrase = HTTPStatus(reply.status).phrase
        except ValueError:
            phrase = "Status"
        lines = [f"HTTP/1.1 {reply.status} {phrase}", "Content-Type: application/json",
                 f"Content-Length: {len(data)}"]
        lines += [f"{k}: {v}" for k, v in reply.headers]
        if self.close_connection:
            lines.append("Connection: close")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, ledger: _Ledger, port: int = 0) -> None:
        self.ledger = ledger
        super().__init__(("127.0.0.1", port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A worker killed mid-request resets its connection: that is the experiment, not an error.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def _die_with_parent(parent_pid: int) -> None:
    """Best effort: SIGKILL this process when the parent goes away, so nothing is orphaned."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _bind(ledger: _Ledger, port: int) -> _Server:
    """Listen on ``port`` (0: an ephemeral one).

    A restart asks for the port its predecessor had, so clients that hold the URL reconnect.
    ``allow_reuse_address`` (SO_REUSEADDR) lets the bind pass the old connections left in
    TIME_WAIT; a port still held by a listener is waited for, up to a bound, then reported.
    """
    deadline = time.monotonic() + _START_TIMEOUT / 2
    while True:
        try:
            return _Server(ledger, port)
        except OSError as e:
            if not port or e.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _serve(ledger_path: str, conn: Any, parent_pid: int, port: int = 0) -> None:
    """The server process's body: report the port (or the failure) through ``conn``; serve."""
    try:
        _die_with_parent(parent_pid)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
        unblock_sigint()
        server = _bind(_Ledger(ledger_path), port)
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        conn.close()
        os._exit(1)
    conn.send(("ready", server.server_address[1]))
    conn.close()
    server.serve_forever(poll_interval=3600)


# --------------------------------------------------------------------------------------- process


def _reap(proc: Any, owner: int) -> None:
    """Kill and reap a server process; safe to call twice and at interpreter exit.

    Only the process that started the server may do it: a worker forked from the owner inherits
    the handle (and its exit hooks) and must never take the shared downstream down with it.
    """
    if proc is None or proc.pid is None or os.getpid() != owner:
        return
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.join()


class DownstreamProcess:
    """A fake downstream server process. Use :func:`start` to make one."""

    def __init__(self, ledger_path: str) -> None:
        self.ledger_path = str(ledger_path)
        self.pid: int | None = None
        self.url: str = ""
        self._proc: Any = None
        self._finalizer: weakref.finalize | None = None
        self._launch()

    def _launch(self, port: int = 0) -> None:
        import multiprocess

        ctx = multiprocess.get_context("fork")
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_serve, args=(self.ledger_path, writer, os.getpid(), port),
                           name="killpoint-downstream", daemon=False)
        with sigint_deferred():
            proc.start()
        writer.close()
        try:
            if not reader.poll(_START_TIMEOUT):
                raise RuntimeError("downstream did not start in time")
            kind, value = reader.recv()
        except (EOFError, RuntimeError) as e:
            _reap(proc, os.getpid())
            raise RuntimeError(
                f"downstream failed to start (exit code {proc.exitcode}): {e}") from e
        finally:
            reader.close()
        if kind != "ready":
            _reap(proc, os.getpid())
            raise RuntimeError(f"downstream failed to start: {value}")
        self._proc = proc
        self.pid = proc.pid
        self.url = f"http://127.0.0.1:{value}"
        # Kill the server if this handle is dropped or the interpreter exits without stop():
        # multiprocess would otherwise wait forever for its non-daemon child at exit. Registered
        # after multiprocess's own exit hook, so it runs first.
        self._finalizer = weakref.finalize(self, _reap, proc, os.getpid())
        self._finalizer.atexit = False
        atexit.register(self._finalizer)

    def stop(self) -> None:
        """SIGKILL the server by PID and reap it. Idempotent."""
        if self._finalizer is not None:
            atexit.unregister(self._finalizer)
            self._finalizer()  # runs _reap once, then detaches
            self._finalizer = None
        if self._proc is not None:
            try:
                self._proc.close()
            except ValueError:
                pass
            self._proc = None

    def restart(self) -> None:
        """Kill the server and start a fresh process on the same ledger file and the same port.

        The URL stays the same, so workers that hold it (and their keep-alive connections, which
        notice the old server is gone) reconnect to the new process, as to a restarted service.
        """
        port = (urlsplit(self.url).port or 0) if self.url else 0
        self.stop()
        self._launch(port)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def __enter__(self) -> DownstreamProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"DownstreamProcess(pid={self.pid}, url={self.url!r}, "
                f"ledger_path={self.ledger_path!r})")


def start(ledger_path: str) -> DownstreamProcess:
    """Fork a downstream server on ``ledger_path`` and return once it is listening."""
    return DownstreamProcess(ledger_path)


# --------------------------------------------------------------------------------------- client


class LostResponse(Exception):
    """The request may or may not have been applied: the answer never arrived (indeterminate)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any]
    replay: bool


class DownstreamClient:
    """A client of one run on one downstream, over a persistent keep-alive connection per thread.

    Safe to share between threads (a library's own worker threads may call through it at once):
    each thread gets its own connection. Each process needs its own client.
    """

    def __init__(self, url: str, run: str, timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"downstream url needs a host and a port: {url!r}")
        self.url = url
        self.run = run
        self.timeout = timeout
        self._host, self._port = parts.hostname, parts.port
        self._prefix = f"/runs/{quote(run, safe='')}"
        self._local = threading.local()  # this thread's connection
        self._owner = threading.current_thread()
        self._lock = threading.Lock()
        self._all: set[http.client.HTTPConnection] = set()  # every thread's, for close()

    @property
    def _conn(self) -> http.client.HTTPConnection | None:
        return getattr(self._local, "conn", None)

    @_conn.setter
    def _conn(self, conn: http.client.HTTPConnection | None) -> None:
        old = getattr(self._local, "conn", None)
        with self._lock:
            if old is not None:
                self._all.discard(old)
            if conn is not None:
                self._all.add(conn)
        self._local.conn = conn

    # -- connection --

    def _connection(self) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is not None and conn.sock is not None:
            # An idle keep-alive connection that is readable was closed by the server (e.g. it
            # was restarted): drop it now rather than lose the next request on it.
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if readable:
                conn.close()
                conn = None
        if conn is None or conn.sock is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
            conn.connect()
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's connection; from the thread that made the client, every thread's."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if threading.current_thread() is self._owner:
            with self._lock:
                others, self._all = list(self._all), set()
            for conn in others:
                conn.close()

    def __enter__(self) -> DownstreamClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _request(self, method: str, path: str, body: Any = None,
                 headers: Mapping[str, str] | None = None,
                 before_read: Callable[[], Any] | None = None) -> tuple[int, dict[str, Any], Any]:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Connection": "keep-alive", "Content-Type": "application/json"}
        if headers:
            hdrs.update(headers)
        try:
            conn = self._connection()
            conn.request(method, self._prefix + path, body=data, headers=hdrs)
            if before_read is not None:
                readable, _, _ = select.select([conn.sock], [], [], self.timeout)
                if not readable:
                    raise TimeoutError("no answer within the timeout")
                before_read()
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise LostResponse(f"{method} {path}: {type(e).__name__}: {e}") from e
        if resp.will_close:
            self.close()
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"raw": raw.decode("utf-8", "replace")}
        return resp.status, parsed, resp.headers

    def _idempotent(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        """A request that is safe to resend once, e.g. on a connection the server closed."""
        try:
            status, parsed, _ = self._request(method, path, body)
        except LostResponse:
            status, parsed, _ = self._request(method, path, body)
        return status, parsed

    # -- API --

    def call(self, resource: str, *, key: str | None, params: Mapping[str, Any],
             meta: Mapping[str, Any] | None, fence: int | None = None,
             fence_scope: str | None = None,
             before_read: Callable[[], Any] | None = None) -> Answer:
        """Send one intent. Raises :class:`LostResponse` when the outcome is indeterminate.

        ``before_read`` runs once the request is fully sent and the answer is readable on the
        socket (so the downstream has finished with it), before the answer is read.
        """
        headers: dict[str, str] = {}
        if key is not None:
            headers["Idempotency-Key"] = key
        if fence is not None:
            headers["Fencing-Token"] = str(int(fence))
        if fence_scope is not None:
            headers["Fencing-Scope"] = fence_scope
        status, body, hdrs = self._request(
            "POST", f"/resources/{quote(resource, safe='')}",
            {"params": dict(params), "meta": dict(meta or {})}, headers, before_read)
        replay = body.get("replay") is True or hdrs.get("Idempotent-Replayed") == "true"
        return Answer(status, body, replay)

    def receipt(self, key: str, *, fence: int | None = None,
                fence_scope: str | None = None) -> dict[str, Any] | None:
        """The stored outcome for ``key``, or None. With a fence and its scope, the downstream also
        raises the highest fence it has seen for that scope (a read that fences out older holders)."""
        headers = {}
        if fence is not None and fence_scope is not None:
            headers = {"Fencing-Token": str(int(fence)), "Fencing-Scope": fence_scope}
        try:
            status, body, _ = self._request("GET", f"/receipts/{quote(key, safe='')}", headers=headers)
        except LostResponse:
            status, body, _ = self._request("GET", f"/receipts/{quote(key, safe='')}", headers=headers)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"downstream receipt {key!r}: {status} {body}")
        return body

    def configure(self, config: Mapping[str, Any]) -> None:
        status, body = self._idempotent("PUT", "/config", dict(config))
        if status not in (200, 204):
            raise RuntimeError(f"downstream configure: {status} {body}")

    def ledger(self) -> list[dict[str, Any]]:
        status, body = self._idempotent("GET", "/ledger")
        if status != 200:
            raise RuntimeError(f"downstream ledger: {status} {body}")
        return body["rows"]
