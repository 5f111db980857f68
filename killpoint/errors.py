"""Every error killpoint raises on purpose derives from :class:`KillpointError`.

Catch ``KillpointError`` to catch them all. Each named error also keeps the built-in base it had
before the common base existed (``InvalidSchedule`` is still a ``ValueError``, ``UnknownScenario`` a
``KeyError``), so code that caught the built-in keeps working.

The errors are defined here, in a module that imports nothing, so that raising or catching one
never loads the harness; the modules that raise them re-export them under their old names
(``killpoint.chaos.InvalidSchedule``, ``killpoint.harness.store.StoreUnavailable``, ...).
"""

from __future__ import annotations

__all__ = [
    "BadInput",
    "InfrastructureError",
    "InvalidAction",
    "InvalidConfig",
    "InvalidEvent",
    "InvalidSchedule",
    "InvalidStore",
    "InvalidPoint",
    "InvalidTarget",
    "InvalidWorkload",
    "KillpointError",
    "KillpointUnavailable",
    "KillpointWarning",
    "LostResponse",
    "OutcomeUnknown",
    "StoreError",
    "StoreUnavailable",
    "StoreUnreachable",
    "UnknownScenario",
]


SHOWN_LIMIT = 200  # characters of a bad value an error message repeats


def shown(value: object) -> str:
    """A value as an error message names it: quoted, and clipped to 200 characters (a 10 kB bad
    value is named, not echoed back whole)."""
    text = repr(value) if isinstance(value, str) else repr(str(value))
    if len(text) <= SHOWN_LIMIT:
        return text
    return f"{text[:SHOWN_LIMIT]}... ({len(str(value))} characters)"


class KillpointError(Exception):
    """The base of every error killpoint raises on purpose."""


class KillpointWarning(KillpointError, UserWarning):
    """What killpoint warns about: a run it will make, but whose verdict may not mean what it seems
    (a stall that races the stuck monitor). ``-W error::killpoint.KillpointWarning`` makes it fatal,
    and then, raised, it is caught with the other errors by ``except KillpointError``."""


# Bad input: the caller must fix the value the message names.


class InvalidAction(KillpointError, ValueError):
    """The text of a failpoint action is not in the grammar."""


class InvalidSchedule(KillpointError, ValueError):
    """The text of a schedule is not in the grammar; the message points at the bad part."""


class InvalidTarget(KillpointError, ValueError):
    """A target name that names no worker we can run."""


class InvalidPoint(KillpointError, ValueError):
    """A crash point the target did not declare (``ctx.point`` raises it at once, naming the declared ones)."""


class InvalidEvent(KillpointError, ValueError):
    """An event of a history (a journal entry, a store event, a target's ``history()`` row) that is
    not in the vocabulary: an unknown kind, a field of the wrong type. The message names the event,
    its kind and the field; so do the attributes."""

    def __init__(self, message: str, *, index: int | None = None, process: str | None = None,
                 kind: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.process = process
        self.kind = kind
        self.field = field


class InvalidWorkload(KillpointError, ValueError):
    """A workload name that names none we can build, or a function that did not build one."""


class InvalidStore(KillpointError, ValueError):
    """The --store value names no backend we have, or one we cannot reach."""


class UnknownScenario(KillpointError, KeyError):
    """A scenario name that is not in the registry; the message lists the valid ones."""

    def __str__(self) -> str:
        # KeyError's str() quotes its argument; the message is a sentence, not a key.
        return str(self.args[0])


class BadInput(KillpointError):
    """Input the user must fix; the message is one line naming the bad value (the CLI exits 2)."""


class InvalidConfig(BadInput, ValueError):
    """A field of a run's configuration (``RunConfig``, ``Timing``) with a value no run can have:
    the message names the field and the value."""


class KillpointUnavailable(KillpointError, RuntimeError):
    """Asked for a part of killpoint this installation does not have (e.g. exploration)."""


# The store.


class StoreError(KillpointError, RuntimeError):
    """The store was asked for something it must refuse (an illegal transition, a missing instance)."""


class StoreUnavailable(KillpointError, RuntimeError):
    """The connection to the store died and the transaction certainly did not commit (COMMIT was
    never sent). The store has dropped the connection; the next call opens a new one.

    A worker that meets it stops working on the step: whatever it held, the lease expires and
    recovery settles the step from the evidence, as after a crash.
    """


class OutcomeUnknown(StoreUnavailable):
    """The connection died after COMMIT was sent and before its answer arrived: the transaction may
    or may not have committed, and only reading the store again can tell. A subclass of
    :class:`StoreUnavailable` (the connection is gone all the same); catch it first to journal the
    operation as indeterminate (``info``) rather than failed.
    """


# The downstream.


class LostResponse(KillpointError):
    """The request may or may not have been applied: the answer never arrived (indeterminate)."""


# The harness's own machinery broke: never a violation (exit 3, the cause in the verdict).


class InfrastructureError(KillpointError, RuntimeError):
    """The infrastructure a run needs broke: the store went away, the downstream failed, the disk
    is full, a process could not be started. A run it ends is unknown, never violated."""


class StoreUnreachable(InfrastructureError):
    """The store's server did not answer at all (the connection refused, timed out, no route) when
    checked before the first run: the infrastructure's failure (exit 3), as a store lost mid-run is,
    not a bad value (a server that answered and refused us is :class:`InvalidStore`, exit 2)."""
