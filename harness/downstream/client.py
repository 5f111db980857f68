"""A client of the downstream: one run, one keep-alive connection."""

from __future__ import annotations

import copy
import json
import select
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import quote, urlsplit

from killpoint.errors import LostResponse as LostResponse


class _Connection:
    """One keep-alive HTTP/1.1 connection to the downstream, spoken by hand: the server is ours
    and always answers with a Content-Length, so a request is one ``sendall`` and an answer two
    or three reads, without ``http.client``'s header parsing (the email package), which cost more
    than the rest of a call."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host = f"{host}:{port}"
        self.sock: socket.socket | None = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    def send(self, method: str, path: str, body: bytes | None, headers: Mapping[str, str]) -> None:
        assert self.sock is not None
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}", "Connection: keep-alive",
                 "Content-Type: application/json", f"Content-Length: {len(body or b'')}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        # UTF-8: an id outside Latin-1 (the key of instance 'job-\u540d\u524d') is sent as its bytes,
        # which the downstream reads back (downstream.server.header); ASCII is the same either way.
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + (body or b""))

    def readable(self, timeout: float) -> bool:
        """Whether something (an answer, or the end of the connection) can be read within
        ``timeout`` seconds."""
        if self._buf or self.sock is None:
            return True
        return bool(select.select([self.sock], [], [], timeout)[0])

    def _fill(self) -> None:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the downstream closed the connection")
        self._buf += chunk

    def answer(self) -> tuple[int, dict[str, str], bytes]:
        """The status, the headers (names in lower case) and the body of the next answer."""
        while b"\r\n\r\n" not in self._buf:
            if len(self._buf) > 65536:
                raise ValueError("the answer's headers are too long")
            self._fill()
        head, self._buf = self._buf.split(b"\r\n\r\n", 1)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/"):
            raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
        status = int(rest.split(" ", 1)[0])
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(self._buf) < length:
            self._fill()
        body, self._buf = self._buf[:length], self._buf[length:]
        return status, headers, body

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


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
        # The URL's path is the session's secret (the server answers nothing without it).
        self._prefix = f"{parts.path.rstrip('/')}/runs/{quote(run, safe='')}"
        self._local = threading.local()  # this thread's connection
        self._owner = threading.current_thread()
        self._lock = threading.Lock()
        self._all: set[_Connection] = set()  # every thread's, for close()
        self._borrowed = False  # made by for_run: the connections are the lender's to close
        # Why the downstream was found silent (no answer within the timeout), shared with the
        # clients for_run makes: a later request says so at once instead of waiting as long again.
        self._silent: list[str] = []

    def for_run(self, run: str) -> "DownstreamClient":
        """A client of ``run`` on the same downstream over this client's connections (a session
        keeps one for its runs: a new connection costs the server a thread, about a millisecond
        before its first answer). Closing it leaves the connections open for the next run."""
        other = copy.copy(self)
        other.run = run
        other._prefix = f"{self._prefix.rsplit('/runs/', 1)[0]}/runs/{quote(run, safe='')}"
        other._borrowed = True
        return other

    def connect(self) -> None:
        """Open this thread's connection now, before the first request needs it: the server
        starts the thread that will answer it meanwhile."""
        self._connection()

    @property
    def _conn(self) -> _Connection | None:
        return getattr(self._local, "conn", None)

    @_conn.setter
    def _conn(self, conn: _Connection | None) -> None:
        old = getattr(self._local, "conn", None)
        with self._lock:
            if old is not None:
                self._all.discard(old)
            if conn is not None:
                self._all.add(conn)
        self._local.conn = conn

    # -- connection --

    def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.sock is not None:
            # An idle keep-alive connection that is readable was closed by the server (e.g. it
            # was restarted): drop it now rather than lose the next request on it.
            if conn.readable(0):
                conn.close()
                conn = None
        if conn is None or conn.sock is None:
            conn = _Connection(self._host, self._port, self.timeout)
            self._conn = conn
        return conn

    def close(self) -> None:
        """Close this thread's connection; from the thread that made the client, every thread's.
        A client made by :meth:`for_run` closes none: they are its lender's."""
        if self._borrowed:
            return
        self._drop()
        if threading.current_thread() is self._owner:
            with self._lock:
                others, self._all = list(self._all), set()
            for conn in others:
                conn.close()

    def _drop(self) -> None:
        """Close this thread's connection (lost, or closed by the server): the next request opens
        another."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> DownstreamClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _request(self, method: str, path: str, body: Any = None,
                 headers: Mapping[str, str] | None = None,
                 before_read: Callable[[], Any] | None = None,
                 *, root: bool = False) -> tuple[int, dict[str, Any], Any]:
        """One request on this thread's connection; ``root``: ``path`` is the session's, not the run's."""
        data = None if body is None else json.dumps(body).encode()
        prefix = self._prefix.rsplit("/runs/", 1)[0] if root else self._prefix
        if self._silent:
            lost = LostResponse(f"{method} {path}: not sent: {self._silent[0]}")
            lost.silent = True  # type: ignore[attr-defined]
            raise lost
        try:
            conn = self._connection()
            conn.send(method, prefix + path, data, headers or {})
            if before_read is not None:
                if not conn.readable(self.timeout):
                    raise TimeoutError("timed out")
                before_read()
            status, hdrs, raw = conn.answer()
        except TimeoutError as e:  # socket.timeout too: connecting, sending or reading
            self._drop()
            why = f"no answer from the downstream at {self._host}:{self._port} for {self.timeout:g} s"
            self._silent.append(f"{why} (to {method} {path})")
            lost = LostResponse(f"{method} {path}: {why}")
            lost.silent = True  # type: ignore[attr-defined]  # not resent: a second wait as long
            raise lost from e
        except (OSError, ValueError) as e:
            self._drop()
            raise LostResponse(f"{method} {path}: {type(e).__name__}: {e} (the downstream at "
                               f"{self._host}:{self._port})") from e
        if hdrs.get("connection", "").lower() == "close":
            self._drop()
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"raw": raw.decode("utf-8", "replace")}
        return status, parsed, hdrs

    def _idempotent(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        """A request that is safe to resend once, e.g. on a connection the server closed."""
        try:
            status, parsed, _ = self._request(method, path, body)
        except LostResponse as exc:
            if getattr(exc, "silent", False):
                raise
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
        replay = body.get("replay") is True or hdrs.get("idempotent-replayed") == "true"
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
        except LostResponse as exc:
            if getattr(exc, "silent", False):
                raise
            status, body, _ = self._request("GET", f"/receipts/{quote(key, safe='')}", headers=headers)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"downstream receipt {key!r}: {status} {body}")
        return body

    def health(self) -> None:
        """Ask the downstream whether it answers (once, within the client's timeout): raises
        :class:`LostResponse` naming it and the time waited when it does not."""
        status, body, _ = self._request("GET", "/health", root=True)
        if status != 200:
            raise RuntimeError(f"downstream health: {status} {body}")

    def configure(self, config: Mapping[str, Any]) -> None:
        status, body = self._idempotent("PUT", "/config", dict(config))
        if status not in (200, 204):
            raise RuntimeError(f"downstream configure: {status} {body}")

    def ledger(self) -> list[dict[str, Any]]:
        status, body = self._idempotent("GET", "/ledger")
        if status != 200:
            raise RuntimeError(f"downstream ledger: {status} {body}")
        rows: list[dict[str, Any]] = body["rows"]
        return rows
