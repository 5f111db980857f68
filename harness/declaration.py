"""What a target declares about itself: its crash points, whether it owns its state, and its hooks.

A target is the code under test; it runs in every worker process with a :class:`WorkerContext`.
A plain function ``fn(ctx)`` is a target that declares nothing: the built-in crash points, and
killpoint's own store as the state the run is judged on. A worker that keeps its state somewhere of
its own (a queue table, a library's system database, a workflow server) says so::

    @killpoint.target(points=("before_claim", "after_claim", "before_call", "after_call",
                              "before_ack", "after_ack"), owns_state=True)
    def worker(ctx):
        ...

    @worker.setup
    def create_tables(run): ...      # in the harness, before any worker starts

and optionally gives hooks, each called with a :class:`TargetRun` (``recover`` with the context of
the worker that replaces a dead one):

``setup(run)``         create its own tables or files for ``run.workload``
``done(run) -> bool``  is the work finished? (quiescence, when it owns its state; asked while
                       workers run too, so workers that serve forever are ended once it says so)
``final_states(run)``  ``{(instance, step): state}`` in DESIGN's state names, for ``effects_accounted``
                       and ``terminates``
``history(run)``       its own records as store events (``claimed``, ``committed``, ...) so that the
                       store-based invariants can judge them
``recover(ctx, dead)`` in a replacement worker, before its body: recovery beyond "start again"
``teardown(run)``      drop what ``setup`` made (always called, also after a failed run)
``restart(run)``       restart the server the target's state lives in (a workflow server), when a
                       fault ``RunConfig.restarts`` maps to ``"target"`` fires
``intent(instance, step)``  the parameters the target means to send for ``step`` (a
                       :class:`~killpoint.harness.workload.StepSpec`) of ``instance`` (an
                       ``InstanceSpec``), when they are not the workload's ``step.params``; None:
                       no declared intent. ``effects_match_intent`` judges every applied effect
                       against it (a compensation against it plus ``"undo"``: the key it undoes)

Only the harness calls hooks; none is required.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence, overload

from killpoint.chaos.points import DEFAULT_POINTS
from killpoint.errors import InvalidPoint, InvalidTarget

if TYPE_CHECKING:
    from killpoint.harness.worker import WorkerContext
    from killpoint.harness.workload import Workload

__all__ = ["InvalidPoint", "InvalidTarget", "Target", "TargetRun", "target"]

HOOKS = ("setup", "done", "final_states", "history", "recover", "teardown", "restart", "intent")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass
class TargetRun:
    """One run, as a target's hooks see it (in the harness process).

    ``namespace`` is unique to this run (lowercase letters, digits and ``_``, at most 63 characters):
    a name for a schema, a table prefix or a file of the target's own. ``state`` is the target's to
    keep anything between its hooks; workers are forked after ``setup``, so they see what it put there.
    """

    run_id: str
    run_dir: str
    namespace: str
    workload: "Workload"
    downstream_url: str
    store: str  # killpoint's own store: "sqlite" or a postgresql:// URL
    seed: int
    state: dict[str, Any] = field(default_factory=dict)


def _check_points(points: Iterable[str]) -> tuple[str, ...]:
    out = tuple(dict.fromkeys(points))
    bad = [p for p in out if not isinstance(p, str) or not p or not p[0].isalpha() or set(p) - _NAME_CHARS]
    if bad or not out:
        raise InvalidTarget(f"points={list(points)!r}: give crash point names such as 'before_ack' "
                            f"(a letter, then letters, digits, '_' or '-')")
    return out


def _check_lease(points: tuple[str, ...], lease_points: Sequence[str] | None,
                 claim_point: str | None) -> tuple[tuple[str, ...], str | None]:
    """The points where a worker holds a lease (where the matrix pauses it past the lease) and the
    point a worker reaches once it holds one (where the new holder waits while a paused worker comes
    back in the takeover window): as declared, each one of ``points``; by default the built-in
    protocol's (:data:`killpoint.chaos.generator.LEASE_HELD`, ``after_claim``) among ``points``."""
    from killpoint.chaos.generator import LEASE_HELD

    if lease_points is None:
        lease = tuple(p for p in points if p in LEASE_HELD)
    else:
        if isinstance(lease_points, str):
            raise InvalidTarget(f"lease_points={lease_points!r}: give a tuple of point names, "
                                f"such as ('after_lock', 'before_ack')")
        lease = tuple(dict.fromkeys(lease_points))
        bad = [p for p in lease if p not in points]
        if bad:
            raise InvalidTarget(f"lease_points: {', '.join(map(repr, bad))} is not among the target's "
                                f"points ({', '.join(points)})")
    if claim_point is None:
        claim = "after_claim" if "after_claim" in points else None
    elif claim_point not in points:
        raise InvalidTarget(f"claim_point={claim_point!r} is not among the target's points ({', '.join(points)})")
    else:
        claim = claim_point
    return lease, claim


class Target:
    """A target and its declaration. Call it like the function it wraps: ``target(ctx)``.

    Invariant: ``points`` is never empty and holds each name once, in the declared order.
    """

    def __init__(self, fn: Callable[["WorkerContext"], None], *, points: Sequence[str] | None = None,
                 owns_state: bool = False, workload: str | None = None,
                 name: str | None = None, sometimes: Sequence[str] = (), run_clock: bool = False,
                 lease_points: Sequence[str] | None = None, claim_point: str | None = None,
                 **hooks: Callable[..., Any] | None) -> None:
        if not callable(fn):
            raise InvalidTarget(f"target {fn!r} is not callable: give a function taking a WorkerContext")
        unknown = sorted(set(hooks) - set(HOOKS))
        if unknown:
            raise InvalidTarget(f"unknown hook {', '.join(map(repr, unknown))}: hooks are {', '.join(HOOKS)}")
        self.fn = fn
        self.points = _check_points(DEFAULT_POINTS if points is None else points)
        self.owns_state = bool(owns_state)
        if workload is not None and not isinstance(workload, str):
            raise InvalidTarget(f"workload={workload!r}: name it, as a built-in name or pkg.module:function")
        self.workload = workload
        if isinstance(sometimes, str) or any(not isinstance(n, str) or not n.strip() for n in sometimes):
            raise InvalidTarget(f"sometimes={sometimes!r}: give a tuple of expectation names, such as "
                                f"('refund retried',)")
        # What must happen at least once across a matrix: each name reached by killpoint.sometimes.
        self.sometimes = tuple(dict.fromkeys(sometimes))
        # A target that owns its state and reads every time of its lease arithmetic from ctx.clock
        # (ctx.clock.now() in place of its database's now(), waits through ctx.clock): it runs on
        # the run clock, with production-like timings. Without it such a target runs in real time.
        self.run_clock = bool(run_clock)
        self.lease_points, self.claim_point = _check_lease(self.points, lease_points, claim_point)
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"
        self.hooks: dict[str, Callable[..., Any]] = {k: v for k, v in hooks.items() if v is not None}
        for k, v in self.hooks.items():
            if not callable(v):
                raise InvalidTarget(f"hook {k}={v!r} is not callable")
        functools.update_wrapper(self, fn)

    def __call__(self, ctx: "WorkerContext") -> None:
        self.fn(ctx)

    def __repr__(self) -> str:
        return f"<killpoint target {self.name} points={list(self.points)} owns_state={self.owns_state}>"

    # -- hooks, also usable as decorators: @worker.setup ------------------------------------------
    def _hook(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        self.hooks[name] = fn
        return fn

    def setup(self, fn: Callable[[TargetRun], None]) -> Callable[[TargetRun], None]:
        return self._hook("setup", fn)

    def done(self, fn: Callable[[TargetRun], bool]) -> Callable[[TargetRun], bool]:
        return self._hook("done", fn)

    def final_states(self, fn: Callable[[TargetRun], Any]) -> Callable[[TargetRun], Any]:
        return self._hook("final_states", fn)

    def history(self, fn: Callable[[TargetRun], Any]) -> Callable[[TargetRun], Any]:
        return self._hook("history", fn)

    def recover(self, fn: Callable[["WorkerContext", str], None]) -> Callable[["WorkerContext", str], None]:
        return self._hook("recover", fn)

    def teardown(self, fn: Callable[[TargetRun], None]) -> Callable[[TargetRun], None]:
        return self._hook("teardown", fn)

    def restart(self, fn: Callable[[TargetRun], None]) -> Callable[[TargetRun], None]:
        return self._hook("restart", fn)

    def intent(self, fn: Callable[[Any, Any], Mapping[str, Any] | None]
               ) -> Callable[[Any, Any], Mapping[str, Any] | None]:
        return self._hook("intent", fn)

    def hook(self, name: str) -> Callable[..., Any] | None:
        return self.hooks.get(name)


@overload
def target(fn: Callable[["WorkerContext"], None], /) -> "Target": ...


@overload
def target(fn: None = None, *, points: Sequence[str] | None = None,
           owns_state: bool = False, workload: str | None = None, sometimes: Sequence[str] = (),
           run_clock: bool = False, lease_points: Sequence[str] | None = None,
           claim_point: str | None = None, setup: Callable[[TargetRun], None] | None = None,
           done: Callable[[TargetRun], bool] | None = None,
           final_states: Callable[[TargetRun], Any] | None = None,
           history: Callable[[TargetRun], Any] | None = None,
           recover: Callable[["WorkerContext", str], None] | None = None,
           teardown: Callable[[TargetRun], None] | None = None,
           intent: Callable[[Any, Any], Mapping[str, Any] | None] | None = None
           ) -> Callable[[Callable[["WorkerContext"], None]], "Target"]: ...


def target(fn: Callable[["WorkerContext"], None] | None = None, *, points: Sequence[str] | None = None,
           owns_state: bool = False, workload: str | None = None, sometimes: Sequence[str] = (),
           run_clock: bool = False, lease_points: Sequence[str] | None = None,
           claim_point: str | None = None, setup: Callable[[TargetRun], None] | None = None,
           done: Callable[[TargetRun], bool] | None = None,
           final_states: Callable[[TargetRun], Any] | None = None,
           history: Callable[[TargetRun], Any] | None = None,
           recover: Callable[["WorkerContext", str], None] | None = None,
           teardown: Callable[[TargetRun], None] | None = None,
           intent: Callable[[Any, Any], Mapping[str, Any] | None] | None = None
           ) -> "Target | Callable[[Callable[[WorkerContext], None]], Target]":
    """Declare a target: ``@killpoint.target`` or ``@killpoint.target(points=..., owns_state=True)``.

    ``points``: the crash points the target marks with ``ctx.point(name)`` (any names; default the
    built-in ones). The matrix, exploration and the pytest plugin schedule exactly these.
    ``owns_state``: the target keeps its state in a store of its own, not killpoint's; the invariants
    that read killpoint's store then say "not applicable" unless ``history`` or ``final_states``
    give them something to judge. ``workload``: the workload runs use unless told otherwise (a
    built-in name or ``pkg.module:function``). ``sometimes``: what must happen at least once across a
    matrix, each name reached by ``killpoint.sometimes(name)`` in some run (an expectation never
    reached makes the matrix unknown, naming it). ``run_clock``: a target that owns its state reads
    every time its leases are computed from ``ctx.clock`` (``ctx.clock.now()``, epoch seconds,
    in place of its database's ``now()``) and waits through it, so it runs on the run clock (virtual
    time, production-like timings); without it such a target runs in real time with short timings.
    ``lease_points``: the points at which a worker holds a lease, where the matrix pauses it past
    the lease (default: those of the built-in protocol's that it declares: ``after_claim``,
    ``before_call`` ... ``before_commit``); ``claim_point``: the point a worker reaches just after it
    took a lease (default ``after_claim`` where declared), where the new holder waits while a worker
    paused past its lease comes back in the takeover window (``pause(until=<claim_point>)``).
    """
    def wrap(f: Callable[["WorkerContext"], None]) -> Target:
        return Target(f, points=points, owns_state=owns_state, workload=workload, sometimes=sometimes,
                      run_clock=run_clock, lease_points=lease_points, claim_point=claim_point, setup=setup,
                      done=done, final_states=final_states, history=history, recover=recover,
                      teardown=teardown, intent=intent)

    return wrap if fn is None else wrap(fn)


def normalize_final_states(raw: Any) -> tuple[Mapping[str, Any], ...]:
    """``final_states(run)`` as history rows: a mapping ``{(instance, step): state}`` or rows with
    ``instance``, ``step`` and ``state``."""
    if raw is None:
        return ()
    if isinstance(raw, Mapping):
        rows = [{"instance": k[0], "step": k[1], "state": v} for k, v in raw.items()]
    else:
        rows = [dict(r) for r in raw]
    for r in rows:
        if not {"instance", "step", "state"} <= set(r):
            raise InvalidTarget(f"final_states gave {r!r}: each row needs instance, step and state")
    return tuple(rows)
