"""A process forked straight from this one (``os.fork``), watched through a pidfd.

Workers are started this way, and the downstream's server: what ``multiprocess.Process`` gave them
(``pid``, ``sentinel``, ``join``, ``exitcode``) without its child bootstrap and bookkeeping, and
without importing multiprocess (and dill) at all where no ``--jobs`` runner is needed.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from typing import Any, Callable

from killpoint.harness.proctitle import set_title

__all__ = ["ForkedWorker"]


class ForkedWorker:
    """A process (a worker, the downstream's server) forked straight from this one, watched
    through a pidfd.

    What ``multiprocess.Process`` gave the worker loop (``pid``, ``sentinel``, ``join``,
    ``exitcode``) without what it costs a worker that only runs a function and then calls
    ``os._exit``: its child bootstrap and bookkeeping took about 1 ms of CPU a worker (a run
    starts three or four). The child gets what the bootstrap gave it that matters: stdin on
    /dev/null, and an exception that escapes printed and turned into exit code 1.
    """

    current: "ForkedWorker | None" = None  # in a child: the handle it was forked through

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        self._target = target
        self._args = args
        self.name = name
        self.pid: int | None = None
        self.sentinel = -1
        self.exitcode: int | None = None

    def start(self) -> None:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                try:
                    fd = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(fd, 0)
                    os.close(fd)
                except OSError:
                    pass
                ForkedWorker.current = self
                set_title(self.name)  # not the parent's command line, which may hold a password
                self._target(*self._args)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - said on stderr, as multiprocess did
                import traceback

                sys.stderr.write(f"Process {self.name}:\n")
                traceback.print_exc()
            finally:
                os._exit(code)
        self.pid = pid
        try:
            self.sentinel = os.pidfd_open(pid)
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise

    def join(self, timeout: float | None = None) -> None:
        """Reap the process once it has ended (waiting up to ``timeout`` seconds for it to end)."""
        if self.exitcode is not None or self.pid is None:
            return
        ready, _, _ = select.select([self.sentinel], [], [], timeout)
        if not ready:
            return
        _, status = os.waitpid(self.pid, 0)
        self.exitcode = os.waitstatus_to_exitcode(status)
        os.close(self.sentinel)

    def is_alive(self) -> bool:
        self.join(0)
        return self.pid is not None and self.exitcode is None
