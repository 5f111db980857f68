"""Restate: the order as a Restate workflow, crashed inside and around ``ctx.run`` on a real server.

``restate:naive`` and ``restate:keyed`` run the order (reserve the stock, then charge the card) as a
Restate workflow written with the ``restate-sdk`` Python SDK. Each step is one ``ctx.run`` whose
closure calls killpoint's downstream. The workflow is served by hypercorn inside killpoint's worker
processes (in the process itself, as ``hypercorn --workers 0`` does, so that a kill hits the process
that runs the step), every worker listening on the same loopback port (``SO_REUSEPORT``): when one
dies, the server's retry reaches another.

The harness starts a real Restate server for each run (the target's ``setup`` hook): the
``restate-server`` binary from npm (see :func:`server_binary`), bound to ``127.0.0.1`` only
(``bind-ip``, ``listen-mode = "tcp"``), telemetry off, its data under the run's folder, one
partition, and a short retry policy (50 ms between attempts) so that a crash is retried at once. The
first worker registers itself with the admin API and submits one workflow per order, each keyed by
the order's id (submitting again is a no-op, so every worker does it). A run is done when the server
reports every order's invocation completed (``done``); ``history`` maps the server's journal of each
order (``sys_journal``, ``sys_journal_events``) onto store events
(:mod:`killpoint.harness.servers.server_history`), and ``final_states`` takes each step's outcome
from them.

Crash points, in the order an attempt passes them (``chaos.at(order, step)``):
``before_run`` (the step's ``ctx.run`` not yet journaled), ``run_before_call``, ``run_in_call``
(inside the closure: the request answered, the answer unread), ``run_after_call`` (the answer read,
the result not yet sent to the server), ``after_run`` (``ctx.run`` returned: the server has the
result). The matrix kills at each; it does not pause there, because Restate holds no lease to
outlive and a frozen worker would keep its place on the shared port, where the kernel still hands
it connections that it never answers.

``naive`` sends a new random idempotency key from inside the closure; ``keyed`` sends
``ctx.request().id + ":" + step``: the invocation id, which the server keeps across retries.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from killpoint import chaos
from killpoint.harness.jobs import at_exit
from killpoint.harness.servers import SdkMissing, check_policy, random_key
from killpoint.harness.servers.server_history import final_states_of, restate_events

if TYPE_CHECKING:
    from killpoint.harness.declaration import Target, TargetRun
    from killpoint.harness.worker import WorkerContext

__all__ = ["POINTS", "RestateServer", "restate_target", "server_binary", "ServerMissing"]

# Named for Restate, not the lease protocol: Restate holds no lease, so the matrix kills at these
# points and does not pause past a lease (a frozen process keeps its place on the shared port).
POINTS = ("before_run", "run_before_call", "run_in_call", "run_after_call", "after_run")
SERVICE = "order"
STEPS = ("reserve", "charge")
EXTRA = "pip install 'killpoint[restate]'"
SERVER_VERSION = "1.7.12"
NPM_PACKAGE = "@restatedev/restate-server-linux-x64"
# Where the documented one-line install puts the server, and where the harness looks after
# $KILLPOINT_RESTATE_SERVER and the PATH.
DEFAULT_PREFIX = os.path.join(os.path.expanduser("~"), ".cache", "killpoint", "restate")
INSTALL = f"npm install --prefix {DEFAULT_PREFIX} {NPM_PACKAGE}@{SERVER_VERSION}"
START_TIMEOUT_S = 30.0


class ServerMissing(SdkMissing):
    """No ``restate-server`` binary could be found (say how to install one)."""


def sdk() -> tuple[Any, Any]:
    """``restate`` and ``hypercorn``, imported on first use (in the harness, before any fork)."""
    try:
        import hypercorn.asyncio
        import hypercorn.config
        import restate
    except ImportError as exc:
        raise SdkMissing(f"the Restate targets need restate-sdk and hypercorn ({exc}); install them "
                         f"with {EXTRA}") from None
    return restate, hypercorn


def server_binary() -> str:
    """The ``restate-server`` binary: ``$KILLPOINT_RESTATE_SERVER``, else ``restate-server`` on the
    PATH, else the npm install under :data:`DEFAULT_PREFIX`."""
    given = os.environ.get("KILLPOINT_RESTATE_SERVER")
    if given:
        if not os.access(given, os.X_OK):
            raise ServerMissing(f"KILLPOINT_RESTATE_SERVER={given[:200]!r} is not an executable file")
        return given
    found = shutil.which("restate-server")
    if found:
        return found
    default = os.path.join(DEFAULT_PREFIX, "node_modules", *NPM_PACKAGE.split("/"), "bin", "restate-server")
    if os.access(default, os.X_OK):
        return default
    raise ServerMissing(f"no restate-server binary: install it with `{INSTALL}`, put it on the PATH, "
                        f"or set KILLPOINT_RESTATE_SERVER to its path")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reserve_port() -> socket.socket:
    """A loopback port held for a run's workers: bound (not listening) with ``SO_REUSEPORT``, so
    the workers' listening sockets may share it while nobody else can be given it. A port only
    looked up (:func:`free_port`) is free again at once: between a worker's death and its
    replacement's bind, another run of a ``--jobs`` batch could be handed it, and its workers
    would then take this run's invocations."""
    return _shared_port_socket(0)


def _shared_port_socket(port: int) -> socket.socket:
    """A loopback socket bound to ``port`` (0: any free one) that other such sockets may share."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def _http(method: str, url: str, body: Any = None, timeout: float = 10.0,
          headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class RestateServer:
    """One ``restate-server`` process on loopback, its data in ``folder``; :meth:`restart` keeps it."""

    def __init__(self, folder: str, *, binary: str | None = None) -> None:
        self.folder = folder
        self.binary = binary or server_binary()
        self.ingress_port, self.admin_port, self.node_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        # A run's teardown stops the server; a run kept for inspection (Session(keep=True)) skips
        # teardown, and an exception may skip it too: the server still ends with this process (a
        # --jobs runner included, see at_exit).
        self._forget = at_exit(self.kill)
        os.makedirs(folder, exist_ok=True)
        self.config_path = os.path.join(folder, "restate.toml")
        with open(self.config_path, "w") as f:
            f.write(self.config())

    @property
    def ingress(self) -> str:
        return f"http://127.0.0.1:{self.ingress_port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def config(self) -> str:
        """Loopback only, no telemetry, one partition, small memory, retries 50 ms apart."""
        data = os.path.join(self.folder, "data")
        return f'''# Written by killpoint for one run.
bind-ip = "127.0.0.1"
listen-mode = "tcp"
bind-port = {self.node_port}
disable-telemetry = true
node-name = "killpoint"
base-dir = {json.dumps(data)}
default-num-partitions = 1
rocksdb-total-memory-size = "256 MiB"
log-filter = "warn"
log-disable-ansi-codes = true
shutdown-timeout = "5s"

[admin]
bind-port = {self.admin_port}
disable-web-ui = true

[admin.query-engine]
memory-size = "64 MiB"

[ingress]
bind-port = {self.ingress_port}

[worker.invoker]
inactivity-timeout = "1s"
abort-timeout = "1s"

[default-retry-policy]
initial-interval = "50ms"
exponentiation-factor = 1.0
max-interval = "50ms"
max-attempts = 200
on-max-attempts = "pause"
'''

    def start(self) -> None:
        log = open(os.path.join(self.folder, "server.log"), "ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESTATE_")}
        # The server asks the public internet for its latest release at start and no setting turns
        # that off: send any outbound HTTP(S) to a closed loopback port so it fails at once and
        # locally; its own calls to the service and the admin API are on loopback and go direct.
        env.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
                   ALL_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost,::1")
        env.update({k.lower(): v for k, v in env.items() if k.endswith("_PROXY")})
        self.proc = subprocess.Popen([self.binary, "--config-file", self.config_path, "--no-logo"],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                     cwd=self.folder, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"restate-server exited with {self.proc.returncode} on start; see "
                                   f"{os.path.join(self.folder, 'server.log')}")
            try:
                # Healthy, and its partition answers queries (after a restart it takes a moment).
                if _http("GET", f"{self.admin}/health", timeout=1)[0] == 200 and \
                        _http("GET", f"{self.ingress}/restate/health", timeout=1)[0] == 200 and \
                        _http("POST", f"{self.admin}/query",
                              {"query": "SELECT count(*) AS n FROM sys_invocation"}, timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"restate-server did not answer within {START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL the server: its crash, not a shutdown."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self, *, crash: bool = True) -> None:
        (self.kill if crash else self.stop)()
        self.start()

    def query(self, sql: str) -> list[dict[str, Any]]:
        status, body = _http("POST", f"{self.admin}/query", {"query": sql})
        if status != 200 or not isinstance(body, dict):
            raise RuntimeError(f"restate admin query: {status} {str(body)[:200]}")
        return list(body.get("rows") or [])


# ----------------------------------------------------------------------------------------------
# the harness's side: hooks


def _orders(run: "TargetRun") -> dict[str, dict[str, Any]]:
    """The workflow input of each order: its steps' resource and parameters."""
    out = {}
    for inst in run.workload.instances:
        out[inst.id] = {"steps": [{"step": s.name, "resource": s.resource, "params": dict(s.params)}
                                  for s in inst.steps if s.resource is not None]}
    return out


def setup(run: "TargetRun") -> None:
    server = RestateServer(os.path.join(run.run_dir, "restate"))
    server.start()
    run.state["restate"] = server
    held = run.state["service_port_held"] = reserve_port()
    run.state["service_port"] = held.getsockname()[1]
    run.state["orders"] = _orders(run)


def restart(run: "TargetRun") -> None:
    """The server crashes (SIGKILL) and starts again on the same data and ports: a fault
    ``RunConfig.restarts`` maps to ``"target"``. Its journal, deployments and invocations survive."""
    server: RestateServer = run.state["restate"]
    server.restart(crash=True)


def teardown(run: "TargetRun") -> None:
    server = run.state.pop("restate", None)
    if server is not None:
        server.kill()
        server._forget()
    held = run.state.pop("service_port_held", None)
    if held is not None:
        held.close()


def _invocations(server: RestateServer) -> dict[str, str]:
    rows = server.query(f"SELECT target_service_key, status FROM sys_invocation "
                        f"WHERE target_service_name = '{SERVICE}'")
    return {r["target_service_key"]: r["status"] for r in rows}


def done(run: "TargetRun") -> bool:
    server: RestateServer = run.state["restate"]
    try:
        found = _invocations(server)
    except (OSError, RuntimeError):
        return False  # the server is restarting or not answering yet: not done
    return set(found) >= set(run.state["orders"]) and all(found[k] == "completed" for k in run.state["orders"])


def _journal(server: RestateServer) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """Per order: its invocation's journal entries, and its journal events (transient failures)."""
    entries = server.query(f"SELECT i.target_service_key AS key, j.index AS index, j.entry_lite_json AS lite, "
                           f"j.appended_at AS at FROM sys_journal j JOIN sys_invocation i ON j.id = i.id "
                           f"WHERE i.target_service_name = '{SERVICE}'")
    events = server.query(f"SELECT i.target_service_key AS key, e.after_journal_entry_index AS after, "
                          f"e.appended_at AS at, e.event_json AS json FROM sys_journal_events e "
                          f"JOIN sys_invocation i ON e.id = i.id WHERE i.target_service_name = '{SERVICE}' "
                          f"AND e.event_type = 'TransientError'")
    journal: dict[str, list[dict[str, Any]]] = {}
    errors: dict[str, list[dict[str, Any]]] = {}
    for r in entries:
        journal.setdefault(r["key"], []).append(r)
    for r in events:
        errors.setdefault(r["key"], []).append(r)
    return journal, errors


def history(run: "TargetRun") -> list[dict[str, Any]]:
    """Each order's journal as store events (:func:`~killpoint.harness.servers.server_history.restate_events`):
    created with the invocation's input, claimed when a step's ``Run`` is journaled, committed with
    its result."""
    server: RestateServer = run.state["restate"]
    journal, errors = _journal(server)
    offset = time.time_ns() - time.monotonic_ns()
    rows: list[dict[str, Any]] = []
    for order_id, order in run.state["orders"].items():
        rows += restate_events(order_id, journal.get(order_id, ()), steps=[s["step"] for s in order["steps"]],
                               offset_ns=offset, errors=errors.get(order_id, ()))
    run.state["history_rows"] = rows
    return rows


def final_states(run: "TargetRun") -> dict[tuple[str, str], str]:
    """Each step's state where the server's journal (:func:`history`) left it: ``succeeded`` or
    ``failed`` once its ``ctx.run`` result is journaled, ``running`` while only its ``Run`` is,
    ``cancelled`` when the invocation ended without running it, else ``pending``."""
    rows = run.state.get("history_rows")
    if rows is None:
        rows = history(run)
    return final_states_of(rows, [(inst.id, s.name) for inst in run.workload.instances for s in inst.steps])


# ----------------------------------------------------------------------------------------------
# the worker's side: the workflow, served


_POINT_LOCK = threading.Lock()


def _point(instance: str, step: str, name: str) -> None:
    """A crash point of one step; the step is set around the point alone, because several
    invocations interleave in one event loop."""
    with _POINT_LOCK, chaos.at(instance, step):
        chaos.point(name)


def make_workflow(ctx: "WorkerContext", *, keyed: bool) -> Any:
    restate, _ = sdk()
    workflow = restate.Workflow(SERVICE)

    @workflow.main()
    async def run(wctx: Any, order: dict[str, Any]) -> dict[str, Any]:
        instance = wctx.key()
        results = {}
        for spec in order["steps"]:
            step = spec["step"]
            _point(instance, step, "before_run")

            async def action(spec: dict[str, Any] = spec, step: str = step) -> dict[str, Any]:
                key = f"{wctx.request().id}:{step}" if keyed else random_key()
                _point(instance, step, "run_before_call")
                # Called from the event loop on purpose: a kill at in_call or after_call then hits
                # the process while this invocation, and no other, is inside its closure.
                answer = ctx.downstream.call(spec["resource"], key=key, params=spec["params"],
                                             meta={"instance": instance, "step": step, "worker": ctx.worker_id,
                                                   "invocation": wctx.request().id, "direction": "forward"},
                                             before_read=lambda: _point(instance, step, "run_in_call"))
                _point(instance, step, "run_after_call")
                if answer.status >= 500 or answer.status in (409, 429):
                    raise RuntimeError(f"downstream answered {answer.status}: retry")
                if answer.status >= 300:
                    raise restate.TerminalError(f"downstream refused: {answer.status}")
                return dict(answer.body)

            results[step] = await wctx.run_typed(step, action)
            _point(instance, step, "after_run")
        return results

    return workflow


def _listening_socket(port: int) -> socket.socket:
    sock = _shared_port_socket(port)
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def register_and_submit(server_admin: str, server_ingress: str, service_url: str,
                        orders: dict[str, dict[str, Any]]) -> None:
    """Register the deployment (once: a second registration of the same one is refused, which is
    fine) and submit each order's workflow (a workflow id runs once: a resubmission is a no-op)."""
    status, body = _http("GET", f"{server_admin}/deployments")
    known = [d for d in (body or {}).get("deployments", []) if d.get("uri", "").rstrip("/") == service_url]
    if not known:
        status, body = _http("POST", f"{server_admin}/deployments", {"uri": service_url})
        if status not in (200, 201, 409):
            raise RuntimeError(f"restate: registering {service_url}: {status} {str(body)[:200]}")
    for order_id, order in orders.items():
        status, body = _http("POST", f"{server_ingress}/{SERVICE}/{order_id}/run/send", order)
        if status not in (200, 202, 409):
            raise RuntimeError(f"restate: submitting {order_id}: {status} {str(body)[:200]}")


def serve(ctx: "WorkerContext", *, keyed: bool) -> None:
    """A worker: serve the workflow until the server reports every order completed."""
    restate, hypercorn = sdk()
    run = ctx.run
    assert run is not None, "the Restate target needs the run its setup() prepared"
    server: RestateServer = run.state["restate"]
    port: int = run.state["service_port"]
    app = restate.app(services=[make_workflow(ctx, keyed=keyed)])
    sock = _listening_socket(port)
    config = hypercorn.config.Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.loglevel = "WARNING"
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.5

    async def main() -> None:
        stop = asyncio.Event()
        serving = asyncio.ensure_future(hypercorn.asyncio.serve(app, config, shutdown_trigger=stop.wait))
        loop = asyncio.get_running_loop()
        orders = run.state["orders"]
        with concurrent.futures.ThreadPoolExecutor(len(orders) + 1) as pool:
            await loop.run_in_executor(pool, register_and_submit, server.admin, server.ingress,
                                       f"http://127.0.0.1:{port}", orders)
            # Each order's workflow, attached to until it completes: no polling.
            await asyncio.gather(*(loop.run_in_executor(pool, wait_for_output, server, order_id)
                                   for order_id in orders))
        stop.set()
        await serving

    asyncio.run(main())  # hypercorn closes the listening socket when it stops


def wait_for_output(server: RestateServer, order_id: str) -> None:
    """Block until the order's workflow has finished (succeeded or failed), attached to it through
    the ingress; a connection the server dropped (it restarted) is simply made again."""
    while True:
        try:
            status, _ = _http("GET", f"{server.ingress}/restate/workflow/{SERVICE}/{order_id}/attach",
                              timeout=120)
        except OSError:
            time.sleep(0.05)
            continue
        if status < 500 or status in (500,):  # 200: its output; 500 with a failure: it failed
            return
        time.sleep(0.05)


def restate_target(policy: str) -> "Target":
    """``restate:naive`` or ``restate:keyed``; imports the SDK and finds the server here, in the
    harness, so that a missing one is said at once and forked workers do not pay for the import."""
    from killpoint.harness.declaration import Target

    check_policy("restate", policy)
    sdk()
    server_binary()
    fn = functools.partial(serve, keyed=policy == "keyed")
    return Target(fn, points=POINTS, owns_state=True, workload="plain", name=f"restate:{policy}",
                  setup=setup, done=done, final_states=final_states, history=history, teardown=teardown,
                  restart=restart)
