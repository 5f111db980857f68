"""A process's own title: what ``ps`` and ``/proc/PID/cmdline`` show for a worker, the downstream
and a ``--jobs`` runner, instead of the command line they were forked with.

A forked process keeps its parent's command line, and with it a ``--store`` URL's password, which
``/proc/PID/cmdline`` shows to every local user for as long as the process lives. Each process
killpoint forks overwrites its copy of that memory (the region the kernel reads ``cmdline`` from,
named by ``arg_start`` and ``arg_end`` in ``/proc/self/stat``) with its own title. Linux only;
elsewhere, or where the region cannot be read, nothing changes. The command's own process keeps its
command line: the secrets advice in the docs (the environment, ``KILLPOINT_PG_DSN`` or ``PGPASSWORD``) is for that one.
"""

from __future__ import annotations

import ctypes

__all__ = ["set_title"]


def _arg_region() -> tuple[int, int] | None:
    """The addresses of this process's command line (``arg_start``, ``arg_end``), or None."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()  # after the command name, which may hold spaces
    try:  # fields 48 and 49 of proc(5); the first after ')' is field 3
        start, end = int(fields[48 - 3]), int(fields[49 - 3])
    except (IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def set_title(title: str, comm: str | None = None) -> None:
    """Show ``title`` as this process's command line, and ``comm`` (if given) as its name (what
    the worker and the downstream set already, ``kp-worker``, ``kp-downstream``). Best effort:
    never raises."""
    data = title.encode("utf-8", "replace")
    if comm is not None:
        try:
            with open("/proc/self/comm", "wb") as fh:
                fh.write(comm.encode("utf-8", "replace")[:15])
        except OSError:
            pass
    region = _arg_region()
    if region is None:
        return
    start, end = region
    size = end - start
    try:
        ctypes.memset(start, 0, size)
        ctypes.memmove(start, data[:size - 1], min(len(data), size - 1))
    except (OSError, ValueError):  # pragma: no cover - the region is this process's own memory
        pass
