"""Independent runs side by side (``--jobs N``), their results in the order they were asked for.

Each job is a runner process forked from this one: it borrows the session's downstream (runs are
isolated by run id) and folder, runs the configurations it is handed one at a time, and sends each
result back. A run's workers are the runner's children, so the run loop is the same as in one
process; results come back in schedule order whatever order they finish in. An interrupt, or an
error here, ends every runner, and each runner ends its own workers and run files first.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from killpoint.errors import InvalidTarget
from killpoint.harness import signals
from killpoint.harness.signals import sigint_deferred, unblock_sigint

if TYPE_CHECKING:
    from killpoint.harness.run import RunConfig, RunResult, Session

# multiprocess (and dill, which it loads) is imported only where a runner or a finalizer is made:
# about 55 ms that a command running one job at a time never needs.


def default_jobs() -> int:
    """The number of cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def at_exit(fn: Callable[..., Any], *args: Any) -> Callable[[], None]:
    """Call ``fn(*args)`` when this process ends: the main process (at its atexit) and a ``--jobs``
    runner alike. A runner ends with ``os._exit`` and runs no atexit hook; multiprocess runs its
    finalizers in both. Returns a function that cancels the call."""
    import multiprocess.util

    finalizer = multiprocess.util.Finalize(None, fn, args=args, exitpriority=10)
    return finalizer.cancel


class JobFailed(RuntimeError):
    """A run raised in a runner process; the message carries its traceback."""


def _dumps(message: Any) -> bytes:
    """A result as bytes: the standard pickle (a run's history in under a millisecond), else dill,
    which knows closures and lambdas but took 20 ms a result (``pickle.loads`` reads both)."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        import multiprocess.reduction

        return bytes(multiprocess.reduction.ForkingPickler.dumps(message))


def _runner(session: "Session", configs: Sequence["RunConfig"], conn: Any, parent_pid: int,
            inherited: Sequence[Any] = (), base: int = 0) -> None:
    """A runner process: run the configurations whose indexes arrive, send each result back. The
    run of ``configs[i]`` is number ``base + i + 1`` of the session: ids unique across runners."""
    from killpoint.harness.proctitle import set_title
    from killpoint.harness.run import Session
    from killpoint.harness.child import die_with_parent

    die_with_parent(parent_pid)
    set_title("killpoint-runner", comm="kp-runner")  # not the command line, which may hold a password
    for end in inherited:  # the parent's ends of the pipes, ours included: with them closed here, a
        end.close()        # dead parent is an EOF to recv(), never a wait forever
    # The parent decides when we end: SIGINT and SIGHUP (a terminal's, sent to the whole group)
    # are ignored. Its SIGTERM (sent once it has told every runner there is no other run) is only
    # remembered: the run in hand stops at its loop's next turn (signals.check), ends its workers
    # and drops its tables as an interrupted run does, and the runner ends. A handler that raised
    # where the signal landed was tried: landing in the run's own cleanup, it cut the drop short
    # and left the run's PostgreSQL schema behind. Before, the signal was ignored and a run longer
    # than the parent's 10 s wait was SIGKILLed, its schema left. The SIGKILL remains for a runner
    # that reaches no check in that time (a target's hook that never returns).
    unblock_sigint()
    signals.remember_only(signal.SIGTERM)
    own = Session(session.base_dir, keep=session.keep, real_time=session.real_time,
                  downstream=session.downstream)
    try:
        while True:
            index = conn.recv()
            if index is None:
                return
            try:
                result = own.run(configs[index], number=base + index + 1)
            except InvalidTarget as exc:  # bad input, for the parent to raise as such
                conn.send_bytes(_dumps((index, None, InvalidTarget(str(exc)))))
                continue
            except Exception as exc:
                conn.send_bytes(_dumps((index, None, f"{type(exc).__name__}: {exc}\n"
                                                     f"{traceback.format_exc()}")))
                continue
            # Without its config: the parent has it (and a target may be a closure).
            conn.send_bytes(_dumps((index, {f.name: getattr(result, f.name)
                                            for f in dataclasses.fields(result) if f.name != "config"},
                                    None)))
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        # The parent is gone, gave up on this result, or ended us (SIGTERM, raised at a check as
        # Terminated): there is no one to tell. End quietly (the parent's own line says why the
        # command ended), never with the traceback multiprocess prints for an exception that leaves
        # a process.
        return
    finally:
        own.close()
        conn.close()


def run_many(session: "Session", configs: Sequence["RunConfig"], jobs: int) -> Iterator["RunResult"]:
    """Run ``configs`` on ``jobs`` runner processes; yield each result in the order of ``configs``."""
    from killpoint.harness.run import RunResult

    configs = list(configs)
    jobs = max(1, min(jobs, len(configs)))
    if jobs == 1:
        yield from session.run_in_turn(configs)
        return
    import multiprocess
    import multiprocess.connection

    fork = multiprocess.get_context("fork")
    runners: list[tuple[Any, Any]] = []
    base = session.reserve(len(configs))  # the runs' numbers, as one process would have given them
    try:
        for _ in range(jobs):
            parent, child = fork.Pipe()
            proc = fork.Process(target=_runner, args=(session, configs, child, os.getpid(),
                                       [c for _, c in runners] + [parent], base),
                                 name="killpoint-runner")
            with sigint_deferred():
                proc.start()
            child.close()
            runners.append((proc, parent))
        pending = iter(range(len(configs)))
        busy: dict[Any, int] = {}
        for _, conn in runners:
            index = next(pending, None)
            if index is not None:
                conn.send(index)
                busy[conn] = index
        done: dict[int, "RunResult"] = {}
        wanted = 0
        while wanted < len(configs):
            while wanted in done:
                yield done.pop(wanted)
                wanted += 1
            if wanted >= len(configs):
                break
            for conn in multiprocess.connection.wait(list(busy)):
                try:
                    index, result, error = pickle.loads(conn.recv_bytes())
                except EOFError:
                    raise JobFailed(f"a runner process died while running "
                                    f"{configs[busy[conn]].schedule}") from None
                del busy[conn]
                if isinstance(error, InvalidTarget):
                    raise error
                if error is not None:
                    raise JobFailed(f"run {index + 1} ({configs[index].schedule}) raised {error}")
                done[index] = RunResult(config=configs[index], **result)
                nxt = next(pending, None)
                if nxt is not None:
                    conn.send(nxt)
                    busy[conn] = nxt
    finally:
        # With SIGINT and SIGTERM held: a second signal (timeout sends SIGTERM to the command and
        # then to its whole group) landing in here cut the ending short, and the runners, their
        # pipes closed by the garbage collector, went on and died on a broken pipe with a traceback
        # each, after the command had said every process was ended.
        with sigint_deferred():
            _end(runners)
            signals.drop_repeats()


def _end(runners: Sequence[tuple[Any, Any]]) -> None:
    """End every runner: told there is no other run, an idle one ends; one still busy after 0.5 s
    is sent SIGTERM, which stops its run in hand at the next check and cleans it up (see
    :func:`_runner`); one still alive 10 s later is SIGKILLed."""
    for _, conn in runners:
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass
    for proc, conn in runners:
        proc.join(0.5 if proc.is_alive() else 0)
        if proc.is_alive():
            proc.terminate()  # remembered by a runner (see _runner): its run stops at a safe point
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        conn.close()
