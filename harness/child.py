"""A worker process, in the forked child: from the fork to ``os._exit``.

:class:`~killpoint.harness.starts.Starts` forks each worker straight from the harness, or forks a
spare ahead that waits (:func:`parked_main`) until it is told who it is. Either way the child ends
with the harness, leaves SIGINT to it, opens its connection to the downstream, installs the
failpoints of its faults and runs the target. Its own room: this code runs in the other process,
and reads nothing of the supervisor's state but what it was handed at the fork.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import threading
from typing import Any

from killpoint import chaos, vocab
from killpoint.chaos.journal import Journal
from killpoint.chaos.points import Failpoints
from killpoint.harness import clock as run_clock
from killpoint.harness import downstream as ds
from killpoint.harness import hooks
from killpoint.harness.declaration import Target
from killpoint.harness.disk import EXIT_DISK, disk_failed
from killpoint.harness.forking import ForkedWorker
from killpoint.harness.signals import unblock_sigint
from killpoint.harness.store.base import Store
from killpoint.harness.targets import WorkerFn
from killpoint.harness.worker import WorkerContext

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def die_with_parent(parent_pid: int | None = None) -> None:
    """Be SIGKILLed when the parent dies. ``parent_pid`` is the parent's pid read before the fork:
    a parent that died between the fork and the prctl left us orphaned already, so we end now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        libc.prctl(_PR_SET_NAME, b"kp-worker", 0, 0, 0)  # its name in ps -o comm, top, perf
    except (OSError, AttributeError):
        pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def _thread_hook(args: Any) -> None:
    """In a worker: a thread the full disk ended (the heartbeat) ends quietly, like the worker."""
    if args.exc_value is not None and disk_failed(args.exc_value):
        return
    threading.__excepthook__(args)


def _prepare(ctx_args: dict[str, Any]) -> ds.DownstreamClient:
    """What a worker process does before it knows who it is: end with the harness, leave SIGINT to
    it, and open its connection to the downstream (the server starts the thread that will answer
    its first call meanwhile)."""
    die_with_parent(ctx_args["parent_pid"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness decides when workers end
    unblock_sigint()
    threading.excepthook = _thread_hook
    client = ds.DownstreamClient(ctx_args["url"], ctx_args["run_id"])
    try:
        client.connect()
    except OSError:
        pass  # the first call says what is wrong with the downstream, where it matters
    return client


def worker_main(target: WorkerFn, ctx_args: dict[str, Any], faults, hits, seed: int,
                events_fd: int, control_fd: int) -> None:
    """The body of a worker process (runs in the forked child)."""
    _work(target, ctx_args, faults, hits, seed, events_fd, control_fd, _prepare(ctx_args))


def parked_main(target: WorkerFn, ctx_args: dict[str, Any], events_fd: int, control_fd: int) -> None:
    """The body of a spare (runs in the forked child): prepared, it waits on its control pipe for
    who it is (:meth:`Supervisor.spawn` sends it), then is that worker. Until then it has journaled
    nothing and holds no time on the run clock; once the store is set up it opens its connection
    to it (it only reads). The end of the pipe (the harness dropped it) ends it."""
    client = _prepare(ctx_args)
    if ctx_args.get("store_ready"):
        # The store is set up: open this process's connection to it now, and read once (the
        # first statement on a connection reads the schema), instead of after the start.
        try:
            ctx_args["store"].now()
        except Exception:  # noqa: BLE001 - the worker meets it again where it matters, and says so
            pass
    size = _read_exactly(control_fd, 4)
    if size is None:
        os._exit(0)
    body = _read_exactly(control_fd, int.from_bytes(size, "big"))
    if body is None:
        os._exit(0)
    who = pickle.loads(body)
    if ForkedWorker.current is not None:
        ForkedWorker.current.name = f"killpoint-worker-{who['label']}"
    ctx_args = {**ctx_args, **who["ctx"]}
    _work(target, ctx_args, who["faults"], who["hits"], who["seed"], events_fd, control_fd, client)


def _read_exactly(fd: int, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _work(target: WorkerFn, ctx_args: dict[str, Any], faults, hits, seed: int,
          events_fd: int, control_fd: int, client: ds.DownstreamClient) -> None:
    clock = ctx_args["clock"]
    run_clock.install(clock)
    try:
        journal = Journal(ctx_args["journal"])
        journal.write(vocab.START, pid=os.getpid(), worker=ctx_args["worker_id"])
        store: Store = ctx_args["store"]
        chaos.points.install(Failpoints(list(faults), journal, seed, events_fd, control_fd, dict(hits),
                                        backends=store.backends, clock=clock,
                                        watch=ctx_args.get("watch", frozenset())))
        declared: Target = target  # type: ignore[assignment]
        ctx = WorkerContext(ctx_args["worker_id"], store, client, journal, ctx_args["workload"],
                            ctx_args["timing"], run_dir=ctx_args["run_dir"],
                            downstream_url=f"{ctx_args['url']}/runs/{ctx_args['run_id']}",
                            points=declared.points, run=ctx_args["target_run"],
                            replaces=ctx_args["replaces"], clock=clock)  # its heartbeat on that clock
        # An exception of the target is a finding (journaled with its traceback, told to the
        # harness); a full disk is the infrastructure's, and is passed on to be named as such.
        code = hooks.worker_body(declared, ctx, journal, events_fd, passes=disk_failed)
        if code == 0:
            journal.write(vocab.FINISH)
    except Exception as exc:
        if not disk_failed(exc):
            raise
        # The disk under the run is full (or gone): the harness finds it and names it; a traceback
        # from each of the workers it keeps replacing would only bury that.
        os._exit(EXIT_DISK)
    os._exit(code)
