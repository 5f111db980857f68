"""The run loop's side of the target contract: the worker body, the hooks, what a target raised.

In a worker process, :func:`worker_body` runs the target (after ``recover`` when the worker replaces
a dead one) and turns an exception nobody injected into a finding: the traceback goes into the
journal (so into the history and the report) and a one-line message to the harness, which stops
replacing workers once the same exception (same type, raised at the same place) comes back.

In the harness, :class:`Hooks` calls the target's own hooks; a hook that raises makes the run
unknown, naming the hook and the exception, and never a violation.
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from killpoint import vocab
from killpoint.errors import InvalidEvent, InvalidTarget, shown
from killpoint.chaos.journal import Journal
from killpoint.harness.declaration import Target, TargetRun, normalize_final_states
from killpoint.harness.events import parse_store_row

# The journal kind, and the key of a worker's message to the harness, when its target raised.
RAISED = vocab.RAISED


def signature(exc: BaseException) -> str:
    """What makes two exceptions "the same": the type and the innermost place it was raised."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f"{tb[-1].filename}:{tb[-1].lineno}" if tb else "?"
    return f"{type(exc).__module__}.{type(exc).__qualname__}@{where}"


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def worker_body(target: Target, ctx: Any, journal: Journal, events_fd: int | None,
                passes: Callable[[BaseException], bool] = lambda exc: False) -> int:
    """Run the target in this worker process; the exit code the process should end with.

    An exception for which ``passes`` is true is not the target's (a full disk): it is re-raised."""
    try:
        recover = target.hook("recover")
        if recover is not None and ctx.replaces is not None:
            recover(ctx, ctx.replaces)
        target(ctx)
    except SystemExit as exc:
        if exc.code in (None, 0):
            return 0
        return _raised(exc, journal, events_fd)
    except BaseException as exc:  # noqa: BLE001 - every exception of a target is a finding
        if passes(exc):
            raise
        return _raised(exc, journal, events_fd)
    return 0


_OWN_FRAMES = (os.path.join("harness", "hooks.py"), os.path.join("harness", "declaration.py"))


def format_traceback(exc: BaseException) -> str:
    """The traceback from the target's first frame on (the harness's own calls left out)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.endswith(_OWN_FRAMES)]
    return "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) + \
        "".join(traceback.format_exception_only(type(exc), exc))


def _raised(exc: BaseException, journal: Journal, events_fd: int | None) -> int:
    text = format_traceback(exc)
    sig = signature(exc)
    journal.write(RAISED, error=describe(exc), exception=type(exc).__name__, where=sig,
                  traceback=text[-8000:])
    if events_fd is not None:
        try:
            os.write(events_fd, (json.dumps({RAISED: sig, "error": describe(exc)}) + "\n").encode())
        except OSError:
            pass
    return 1


@dataclass
class Raised:
    """The exceptions workers raised in one run, by signature."""

    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # signature -> "TypeError: ..."
    workers: dict[str, list[str]] = field(default_factory=dict)  # signature -> worker labels
    repeated: str | None = None  # the first signature seen twice: replacements stop

    def add(self, sig: str, error: str, worker: str) -> bool:
        """Record one; True when it repeats an earlier one (the run stops replacing workers)."""
        self.counts[sig] = self.counts.get(sig, 0) + 1
        self.errors.setdefault(sig, error)
        self.workers.setdefault(sig, []).append(worker)
        if self.counts[sig] > 1 and self.repeated is None:
            self.repeated = sig
        return self.counts[sig] > 1

    def reasons(self) -> tuple[str, ...]:
        out = []
        for sig, n in self.counts.items():
            who = ", ".join(self.workers[sig])
            stop = "; replacements stopped at its first repeat" if sig == self.repeated else ""
            out.append(f"the target raised {self.errors[sig]} in worker{'s' if n > 1 else ''} {who} "
                       f"({n} time{'s' if n > 1 else ''}{stop}); its traceback is in the history")
        return tuple(out)


class Hooks:
    """The target's hooks as the harness calls them; a hook that raises is recorded, never thrown."""

    def __init__(self, target: Target, run: TargetRun) -> None:
        self.target = target
        self.run = run
        self.errors: list[str] = []
        # What made the target's history() untrustworthy (an unknown kind, a bad field, a step
        # moved with no event for it): also in ``errors``; the invariants that judge its events
        # then judge nothing (unknown, naming this), rather than judge a history with holes in it.
        self.history_errors: list[str] = []
        self.setup_ok = True  # False once setup() raised: the other hooks have nothing to read

    def _call(self, name: str, default: Any, *args: Any) -> Any:
        fn = self.target.hook(name)
        if fn is None:
            return default
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - the run's verdict says so
            if name == "setup" and isinstance(exc, InvalidTarget):
                raise  # it cannot run as asked (a store it cannot use): bad input, named once
            self.errors.append(f"the target's {name}() hook raised {describe(exc)}")
            return default

    def setup(self) -> bool:
        before = len(self.errors)
        self._call("setup", None, self.run)
        self.setup_ok = len(self.errors) == before
        return self.setup_ok

    def done(self) -> bool:
        """Without a ``done`` hook, a target that owns its state is done once its workers exit."""
        return self.setup_ok and bool(self._call("done", True, self.run))

    def final_states(self) -> tuple[Mapping[str, Any], ...]:
        raw = self._call("final_states", None, self.run) if self.setup_ok else None
        try:
            return normalize_final_states(raw)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"the target's final_states() hook gave {describe(exc)}")
            return ()

    def history(self, end: int) -> list[dict[str, Any]]:
        """Store events from ``history()``; an event without ``t`` is placed after ``end``, in order.
        An event of an unknown kind or with a bad field is left out and named, once per kind or
        field, in :attr:`history_errors` (see :func:`history_problem`)."""
        raw = self._call("history", None, self.run) if self.setup_ok else None
        before = len(self.errors)
        events: list[dict[str, Any]] = []
        unknown: dict[str, int] = {}
        # (kind, field) -> (times, the first event with it, what is wrong with that one)
        bad: dict[tuple[str, str], tuple[int, dict[str, Any], str]] = {}
        for n, e in enumerate(_rows(raw, self.errors)):
            if "kind" not in e:
                self.errors.append(f"the target's history() hook gave an event without a kind: {e!r:.200}")
                continue
            try:
                parse_store_row(e, index=n)
                problem = history_problem(e)
            except InvalidEvent as exc:
                if exc.field == "kind":
                    # No invariant reads a kind outside the vocabulary: a misspelt one ('claim' for
                    # 'claimed') would hide what it records, and the run could come out valid.
                    unknown[str(e["kind"])] = unknown.get(str(e["kind"]), 0) + 1
                    continue
                problem = f"{exc.field}={e.get(str(exc.field))!r} ({str(exc).split(': ', 1)[-1]})"
            if problem is not None:  # counted by kind and field, named with the first bad value
                where = (e["kind"], problem.split("=")[0])
                times, first, said = bad.get(where, (0, e, problem))
                bad[where] = (times + 1, first, said)
                continue
            events.append({**e, "t": int(e.get("t") or end + n + 1)})
        if unknown:
            kinds = ", ".join(f"{shown(k)} ({n}x)" for k, n in sorted(unknown.items()))
            self.errors.append(f"the target's history() hook gave events of unknown kind {kinds}; the "
                               f"kinds are {', '.join(sorted(vocab.STORE_KINDS))}")
        for times, first, problem in bad.values():
            self.errors.append(f"the target's history() hook gave {times} {first['kind']} event"
                               f"{'s' if times > 1 else ''} with {problem}, as in {shown(repr(first))}")
        self.history_errors.extend(self.errors[before:])
        return events

    def untrusted(self, why: str) -> None:
        """Record that the target's history() cannot be trusted, and why."""
        self.errors.append(why)
        self.history_errors.append(why)

    def teardown(self) -> None:
        self._call("teardown", None, self.run)

    def intent(self, instance: Any, step: Any) -> Mapping[str, Any] | None:
        """The parameters the target declares for ``step`` of ``instance``: its ``intent`` hook's
        answer, else the workload's ``step.params``; None (or empty) declares none. A target that
        owns its state calls the downstream with parameters of its own making: without an ``intent``
        hook it declares none (``effects_match_intent`` is then not applicable, never a false alarm)."""
        if self.target.hook("intent") is None:
            return None if getattr(self.target, "owns_state", False) else (dict(step.params) or None)
        raw = self._call("intent", None, instance, step)
        if raw is None or isinstance(raw, Mapping):
            return None if raw is None else dict(raw)
        self.errors.append(f"the target's intent() hook gave {raw!r:.200} for {instance.id}/{step.name}: "
                           f"give a mapping of the step's parameters, or None for none")
        return None

    def restart(self) -> bool:
        """Restart the target's own server; False when it has no ``restart`` hook or the hook raised."""
        if self.target.hook("restart") is None:
            self.errors.append("a fault asked to restart the target's server, but the target has no "
                               "restart() hook")
            return False
        before = len(self.errors)
        self._call("restart", None, self.run)
        return len(self.errors) == before


# A history() event's fields and what each must be when it is there (None is always allowed).
_INT_FIELDS = ("state_version", "fence", "lease_version", "attempt")
_TEXT_FIELDS = ("worker", "actor")


def history_problem(e: Mapping[str, Any]) -> str | None:
    """What is wrong with one event a target's ``history()`` gave (its kind is known), in words
    naming the field (None: nothing). ``instance`` and ``step`` name the step; ``t`` is
    CLOCK_MONOTONIC nanoseconds; versions, fences and attempts are whole numbers; states are
    DESIGN's names. A value of another type made checkers compare a string with a number and
    report a correct worker's chain as broken."""
    from killpoint.harness.states import STATES

    for name in ("instance", "step"):
        if not isinstance(e.get(name), str) or not e.get(name):
            return f"{name}={e.get(name)!r} (give the step's {name} as a non-empty string)"
    t = e.get("t")
    if t is not None and (isinstance(t, bool) or not isinstance(t, int)):
        return f"t={t!r} (give time.monotonic_ns(), a whole number of nanoseconds, or leave t out)"
    for name in _INT_FIELDS:
        value = e.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{name}={value!r} (give a whole number)"
    for name in _TEXT_FIELDS:
        value = e.get(name)
        if value is not None and not isinstance(value, str):
            return f"{name}={value!r} (give a string)"
    for name in ("from_state", "to_state"):
        value = e.get(name)
        if value is not None and value not in STATES:
            return f"{name}={value!r} (the states are {', '.join(STATES)})"
    return None


def _rows(raw: Any, errors: list[str]) -> Iterable[dict[str, Any]]:
    if raw is None:
        return []
    try:
        return [dict(e) for e in raw]
    except Exception as exc:  # noqa: BLE001
        errors.append(f"the target's history() hook gave {describe(exc)}")
        return []

