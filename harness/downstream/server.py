"""The downstream's HTTP server: routes requests to the ledger; the body of the server process."""

from __future__ import annotations

import ctypes
import errno
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from killpoint.harness.downstream.ledger import BadRequest, Ledger, Reply
from killpoint.harness.signals import unblock_sigint

START_TIMEOUT = 10.0
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


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
                raise BadRequest(f"{header} is not an integer: {value!r}") from None
        meta[name] = value
    return meta


_MAX_HEADERS = 100
_MAX_LINE = 65536


class _Headers(dict):
    """A request's headers by lower-cased name (the first of a repeated one), read as
    ``email.message.Message`` is read here: ``get(name, default)``, any case."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "killpoint-downstream"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    def parse_request(self) -> bool:
        """The request line and headers, read without the email package (which took 70 us of the
        server's CPU a request, a quarter of a receipt lookup): HTTP/1.0 and 1.1 only, as
        killpoint's client and any HTTP library send them. A malformed request gets 400 and the
        connection closed; what the protocol keeps (keep-alive, ``Connection: close``,
        ``Expect: 100-continue``) is kept."""
        self.command = None  # type: ignore[assignment]  # as the standard library's: none read yet
        self.request_version = self.default_request_version
        self.close_connection = True
        raw: bytes = getattr(self, "raw_requestline")  # set by handle_one_request, untyped there
        self.requestline = str(raw, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if not words:
            return False
        if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
            self.request_version = "HTTP/1.0"  # the answer has a status line, then the connection closes
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request line ({self.requestline[:200]!r})")
            return False
        self.command, self.path, self.request_version = words
        headers = _Headers()
        while True:
            line = self.rfile.readline(_MAX_LINE + 1)
            if len(line) > _MAX_LINE:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            if len(headers) >= _MAX_HEADERS:
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
                return False
            name, sep, value = str(line, "iso-8859-1").partition(":")
            if not sep or not name.strip():
                self.send_error(HTTPStatus.BAD_REQUEST, f"Bad header line ({line[:200]!r})")
                return False
            headers.setdefault(name.strip().lower(), value.strip())
        self.headers = headers  # type: ignore[assignment]
        connection = headers.get("Connection", "").lower()
        self.close_connection = self.request_version != "HTTP/1.1" or connection == "close"
        if self.request_version == "HTTP/1.0" and connection == "keep-alive":
            self.close_connection = False
        if headers.get("Expect", "").lower() == "100-continue" and self.request_version == "HTTP/1.1":
            return self.handle_expect_100()
        return True

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
            raise BadRequest("body is not JSON") from None

    def _dispatch(self, method: str) -> None:
        try:
            reply = self._route(method)
        except BadRequest as e:
            reply = Reply(400, {"error": "bad_request", "detail": str(e)})
        except Exception as e:  # a bug: say so instead of hanging the client
            reply = Reply(500, {"error": "internal", "detail": repr(e)})
        if reply.drop:
            self.close_connection = True  # the effect is applied; the answer is never sent
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self._send(reply)

    def _route(self, method: str) -> Reply:
        ledger = self.server.ledger
        parts = [unquote(p) for p in self.path.split("?", 1)[0].split("/")[1:]]
        # Invariant: nothing below runs, and no ledger row is written, without the session's secret.
        if not parts or not hmac.compare_digest(parts[0].encode(), self.server.secret.encode()):
            self.close_connection = True  # its body (if any) is never read
            return Reply(403, {"error": "forbidden",
                               "detail": "the URL does not carry this session's secret"})
        parts = parts[1:]
        if method == "GET" and parts == ["health"]:
            return Reply(200, {"ok": True, "pid": os.getpid()})
        if len(parts) < 3 or parts[0] != "runs":
            return Reply(404, {"error": "not_found"})
        run, what, rest = parts[1], parts[2], parts[3:]
        if method == "PUT" and what == "config" and not rest:
            ledger.configure(run, self._body())
            return Reply(204, None)
        if method == "GET" and what == "ledger" and not rest:
            return Reply(200, {"rows": ledger.rows(run)})
        if method == "GET" and what == "receipts" and len(rest) == 1:
            token, scope = self.headers.get("Fencing-Token"), self.headers.get("Fencing-Scope")
            if token is not None and scope:
                try:
                    ledger.raise_fence(run, scope, int(token))
                except ValueError:
                    return Reply(400, {"error": "bad_request",
                                        "detail": f"Fencing-Token is not an integer: {token!r}"})
            found = ledger.receipt(run, rest[0])
            return Reply(200, found) if found else Reply(404, {"error": "no_receipt"})
        if method == "POST" and what == "resources" and len(rest) == 1:
            return self._resource(run, rest[0])
        return Reply(404, {"error": "not_found"})

    def _resource(self, run: str, resource: str) -> Reply:
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
                    raise BadRequest(f"Fencing-Token is not an integer: {token!r}") from None
            body = self._body()
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            params = body.get("params", {})
            meta = body.get("meta") or {}
            if not isinstance(params, dict) or not isinstance(meta, dict):
                raise BadRequest("params and meta must be JSON objects")
            meta = {**_header_meta(self.headers), **meta}
        except BadRequest as e:
            return ledger.bad_request(run, resource, key, fence, params, meta, str(e))
        return ledger.post(run, resource, key, fence, scope, params, meta)

    def _send(self, reply: Reply) -> None:
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
    """One thread a connection, as ``ThreadingHTTPServer``; a thread whose connection closed
    waits for the next one instead of ending (a new thread cost the server about 0.45 ms of CPU,
    and every worker opens a connection of its own)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, ledger: Ledger, secret: str, port: int = 0) -> None:
        self.ledger = ledger
        self.secret = secret
        self._idle: list[threading.Thread] = []
        self._handed: dict[threading.Thread, tuple[Any, Any]] = {}
        self._wakeup = threading.Condition()
        super().__init__(("127.0.0.1", port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._wakeup:
            if self._idle:
                thread = self._idle.pop()
                self._handed[thread] = (request, client_address)
                self._wakeup.notify_all()
                return
        threading.Thread(target=self._serve_connections, args=(request, client_address), daemon=True).start()

    def _serve_connections(self, request: Any, client_address: Any) -> None:
        me = threading.current_thread()
        while True:
            self.process_request_thread(request, client_address)  # handles it, then closes it
            with self._wakeup:
                self._idle.append(me)
                while me not in self._handed:
                    self._wakeup.wait()
                request, client_address = self._handed.pop(me)

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
            libc.prctl(_PR_SET_NAME, b"kp-downstream", 0, 0, 0)  # its name in ps -o comm, top
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _bind(ledger: Ledger, secret: str, port: int) -> _Server:
    """Listen on ``port`` (0: an ephemeral one).

    A restart asks for the port its predecessor had, so clients that hold the URL reconnect.
    ``allow_reuse_address`` (SO_REUSEADDR) lets the bind pass the old connections left in
    TIME_WAIT; a port still held by a listener is waited for, up to a bound, then reported.
    """
    deadline = time.monotonic() + START_TIMEOUT / 2
    while True:
        try:
            return _Server(ledger, secret, port)
        except OSError as e:
            if not port or e.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def serve(ledger_path: str, ready_fd: int, parent_pid: int, secret: str, port: int = 0) -> None:
    """The server process's body: report the port (or the failure) as one JSON line on
    ``ready_fd``, then close it; serve requests whose path starts with ``secret`` (any other gets
    403 and writes nothing)."""
    def say(kind: str, value: Any) -> None:
        os.write(ready_fd, (json.dumps([kind, value]) + "\n").encode())
        os.close(ready_fd)

    try:
        _die_with_parent(parent_pid)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
        unblock_sigint()
        server = _bind(Ledger(ledger_path), secret, port)
    except BaseException as e:
        say("error", f"{type(e).__name__}: {e}")
        os._exit(1)
    say("ready", server.server_address[1])
    server.serve_forever(poll_interval=3600)
