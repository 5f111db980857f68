"""What the library targets share: their workload, the HTTP call by URL, the pause guard, the clock.

The pause guard is why a paused worker never stalls the others. A pause freezes the whole process
(SIGSTOP); a library thread frozen inside a database transaction would keep its SQLite lock and
every other worker would wait on it (for up to the library's busy timeout, 30 s for DBOS). So every
thread of the worker *enters* the guard while it holds a database connection, and a pause *acquires*
it (it is one of the failpoints' pause locks): the pause waits until no other thread holds a
connection, and no thread takes one until the worker is resumed.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from killpoint.harness.worker import REAL_TIME_TIMING
from killpoint.harness.workload import IDEMPOTENT, InstanceSpec, StepSpec, Workload

# The libraries keep time on the wall clock (DBOS's queue polls, LangGraph's lease in SQLite's
# database time, procrastinate's heartbeats in PostgreSQL's now()), which the run's virtual clock
# cannot move: their leases, heartbeats and polls are the real-time ones, whatever the run's timing.
TIMING = REAL_TIME_TIMING

# The resources the workflow calls: keyed, no fencing (none of these libraries has a fence to send).
RESOURCES = {"inventory": {"legacy": False, "fencing": False},
             "payment": {"legacy": False, "fencing": False}}


def order_workload(seed: int = 0) -> Workload:
    """One order of two steps, reserve then charge, each one call to the downstream.

    Two steps, so that a crash in the second shows the first is not run again (the library's
    durability) as well as the second's duplicate (the missing key)."""
    qty = 1 + seed % 5
    amount = 1200 + 37 * (seed % 100)
    steps = (StepSpec("reserve", IDEMPOTENT, "inventory", params={"sku": "SKU-KP-001", "qty": qty}),
             StepSpec("charge", IDEMPOTENT, "payment", params={"amount": amount, "currency": "EUR",
                                                              "card": "tok_kp"}))
    return Workload("lib-order", (InstanceSpec("order-1", steps, {"amount": amount, "qty": qty}),),
                    dict(RESOURCES))


class Downstream:
    """POST one intent to ``{downstream_url}/resources/{resource}`` over http.client, one
    keep-alive connection per thread, with the documented headers."""

    def __init__(self, url: str, worker: str) -> None:
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"downstream url needs a host and a port: {url!r}")
        self._host, self._port, self._path = parts.hostname, parts.port, parts.path.rstrip("/")
        self._worker = worker
        self._local = threading.local()

    def post(self, resource: str, params: Mapping[str, Any], *, key: str, instance: str, step: str,
             attempt: int | None = None, fence: int | None = None,
             scope: str | None = None) -> tuple[int, dict[str, Any]]:
        headers = {"Content-Type": "application/json", "Idempotency-Key": key,
                   "Killpoint-Instance": instance, "Killpoint-Step": step, "Killpoint-Worker": self._worker}
        if attempt is not None:
            headers["Killpoint-Attempt"] = str(attempt)
        if fence is not None:
            headers["Fencing-Token"] = str(fence)
            if scope is not None:
                headers["Fencing-Scope"] = scope
        body = json.dumps({"params": dict(params),
                           "meta": {"instance": instance, "step": step, "worker": self._worker}})
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self._host, self._port, timeout=10)
        try:
            conn.request("POST", f"{self._path}/resources/{resource}", body=body, headers=headers)
            answer = conn.getresponse()
            raw = answer.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            self._local.conn = None
            raise
        return answer.status, (json.loads(raw) if raw else {})

    def post_step(self, spec: Any, key: str, instance: str, step: str) -> tuple[int, dict[str, Any]]:
        """POST a step's intent; while another delivery of the same task is calling under the same
        key (409 ``in_flight``), ask again a moment later: the answer is then that call's."""
        for _ in range(500):
            status, body = self.post(spec.resource, spec.params, key=key, instance=instance, step=step)
            if status == 409 and body.get("error") == "in_flight":
                time.sleep(0.005)
                continue
            return status, body
        raise RuntimeError(f"{spec.resource}: key {key!r} stayed in flight")


class PauseGuard:
    """Shared by the threads that hold a database connection; taken whole by a pause.

    ``enter``/``leave`` around each connection a thread holds (reentrant per thread);
    ``acquire``/``release`` by the pausing thread, which does not wait for its own connections.
    Invariant: while a pause holds the guard, no other thread of this process holds a connection.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holders: dict[int, int] = {}  # thread id -> connections it holds
        self._paused_by: int | None = None

    def enter(self) -> None:
        me = threading.get_ident()
        with self._cond:
            while self._paused_by is not None and self._paused_by != me:
                self._cond.wait()
            self._holders[me] = self._holders.get(me, 0) + 1

    def leave(self, owner: int | None = None) -> None:
        """Give back one connection of thread ``owner`` (default: this thread)."""
        me = threading.get_ident() if owner is None else owner
        with self._cond:
            n = self._holders.get(me, 0) - 1
            if n > 0:
                self._holders[me] = n
            else:
                self._holders.pop(me, None)
            self._cond.notify_all()

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._cond:
            while self._paused_by is not None or any(t != me for t in self._holders):
                self._cond.wait()
            self._paused_by = me

    def release(self) -> None:
        with self._cond:
            self._paused_by = None
            self._cond.notify_all()


def install_guard(ctx: Any) -> PauseGuard:
    """A guard that this worker's pauses take (see the module docstring)."""
    guard = PauseGuard()
    ctx.pause_waits_for(guard)
    return guard


def guard_sqlalchemy(guard: PauseGuard) -> None:
    """Every SQLAlchemy pool of this process enters the guard for as long as a connection is out."""
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    out: dict[int, int] = {}  # connection record -> the thread that checked it out

    def checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        guard.enter()
        out[id(record)] = threading.get_ident()

    def checkin(dbapi_conn: Any, record: Any) -> None:
        owner = out.pop(id(record), None)
        if owner is not None:
            guard.leave(owner)

    event.listen(Pool, "checkout", checkout)
    event.listen(Pool, "checkin", checkin)


def monotonic_ns(epoch_ms: float | None, fallback: int) -> int:
    """A library's wall-clock time (epoch milliseconds) on the history's clock (CLOCK_MONOTONIC)."""
    if epoch_ms is None:
        return fallback
    return int(epoch_ms * 1_000_000) - (time.time_ns() - time.monotonic_ns())


def queue_targets(lib: str, points: tuple[str, ...], work: Callable[[Any], None], setup: Callable[..., None], *,
                  done: Callable[..., bool], final_states: Callable[..., Any],
                  teardown: Callable[..., None], history: Callable[..., Any] | None = None) -> dict[str, Any]:
    """A task queue's ``naive`` and ``keyed`` targets: ``work(ctx)`` in each worker, ``setup(run,
    keyed=...)`` and the other hooks in the harness, on the order workload; a target that owns its
    state (the queue's), with a ``history()`` where the library records enough for one."""
    import killpoint

    def declare(variant: str) -> Any:
        keyed = variant == "keyed"
        return killpoint.Target(work, name=f"{lib}:{variant}", points=points, owns_state=True,
                                workload="killpoint.harness.libs.common:order_workload",
                                setup=lambda run: setup(run, keyed=keyed), done=done, final_states=final_states,
                                history=history, teardown=teardown)

    return {"naive": declare("naive"), "keyed": declare("keyed")}


def named_target(lib: str, targets: Mapping[str, Any], variant: str) -> Any:
    """``targets[variant]``, or an InvalidTarget naming the known ones."""
    import killpoint

    try:
        return targets[variant]
    except KeyError:
        raise killpoint.InvalidTarget(f"unknown {lib} target {variant!r}: known are "
                                      f"{', '.join(f'{lib}:{v}' for v in targets)}") from None

