"""Schedule generation: the crash matrices every caller enumerates, and their sharding.

The ``killpoint matrix`` command, ``killpoint selftest`` and the pytest plugin's ``killpoint.matrix()``
and marked tests all draw their schedules from here, so the same arguments give the same list, in the
same order, everywhere (the role of a Jepsen generator; exploration draws from
:mod:`killpoint.chaos.strategies` instead).

- :func:`single_crash_schedules` -- worker A faulted once at each point of each step (``kill``, a
  ``hang`` at the heartbeat);
- :func:`single_fault_schedules` -- those, plus A paused past its lease where it holds one (coming
  back once the new holder has claimed, before it commits; and once the step moved on), plus A's
  database sessions terminated at each point (in each write transaction at the store's own points);
- :func:`double_crash_schedules` -- every ordered pair of crashes, each with the restart rule it needs;
- :func:`matrix` -- one of those by depth, as :class:`Planned` runs;
- :func:`hits_of` and :func:`path_schedules` -- the later hits a fault-free run of worker A really
  reached (a retry, a compensation: a point passed again on one instance's step), and a crash at
  each one that ends a path the first hits do not (path exploration, as failpoint tools do);
- :func:`in_shard`, :func:`shard` and :func:`budget_share` -- the K-th of N deterministic shares.

Pure: nothing here starts a process or reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence, TypeVar

from killpoint.chaos.actions import parse as parse_actions
from killpoint.chaos.points import DB_POINTS
from killpoint.chaos.schedule import Fault, Schedule

__all__ = ["ACTIONS", "DB_HITS", "FORMS", "HIT_MODES", "HIT_ORDER", "LEASE_HELD", "PAUSES", "Hit", "Planned",
           "budget_share", "double_crash_schedules", "hit_order", "hits_of", "in_shard", "later_hits",
           "matrix", "path_schedules", "repeated_steps", "shard", "single_crash_schedules",
           "single_fault_schedules"]

FORMS = ("workers", "hits")
# The order a worker hits the points of one attempt in (heartbeat right after the claim).
HIT_ORDER = ("before_claim", "after_claim", "heartbeat", "before_call", "in_call", "after_call",
             "before_receipt", "after_receipt", "before_commit", "after_commit")
# The points at which the faulted worker holds a lease: a pause there makes it a stale worker.
LEASE_HELD = ("after_claim", "before_call", "in_call", "after_call", "before_receipt", "after_receipt",
              "before_commit")
ACTIONS = ("kill", "pause", "terminate")
# Where a worker paused past its lease comes back, in the matrix: in the takeover window (the new
# holder has claimed the step and waits at its after_claim while the stale worker goes on), and
# once the new holder has moved the step on (a plain pause). The first needs the point after_claim.
PAUSES = ("1*pause(until=after_claim)", "1*pause")
# At a db point, the hits ``terminate`` lands on: the write transactions of A's first attempt at a
# step -- its claim, its receipt and its commit.
DB_HITS = (1, 2, 3)

T = TypeVar("T")


@dataclass(frozen=True)
class Planned:
    """One schedule of a matrix and the run settings it needs (None: the run's default)."""

    schedule: Schedule
    same_identity: float | None = None  # the chance a killed worker restarts under its own identity

    def overrides(self) -> dict[str, Any]:
        """The :class:`killpoint.RunConfig` fields this schedule sets."""
        return {} if self.same_identity is None else {"same_identity": self.same_identity}


def single_crash_schedules(step_names: Iterable[str | None], points: Iterable[str]) -> list[Schedule]:
    """Worker A faulted once at each point of each step: ``kill``, or ``hang`` for the heartbeat."""
    points = tuple(points)
    out = []
    for step in step_names:
        for point in points:
            action = "hang" if point == "heartbeat" else "kill"
            out.append(Schedule((Fault("A", point, parse_actions(action), step),)))
    return out


def _pauses(claim: str | None) -> tuple[str, ...]:
    """The pauses of :data:`PAUSES`, the takeover-window one resuming at ``claim`` (none without)."""
    return tuple(p.replace("until=after_claim", f"until={claim}") for p in PAUSES
                 if claim is not None or "until=" not in p)


def single_fault_schedules(step_names: Iterable[str | None], points: Iterable[str],
                           actions: Sequence[str] = ("kill", "pause"),
                           terminate_points: Iterable[str] | None = None,
                           passes: Iterable[str] | None = None,
                           lease: Iterable[str] | None = None,
                           claim: str | None = None) -> list[Schedule]:
    """The single-crash schedules (``kill``); with ``pause``, worker A frozen once past its lease
    at every point where it holds one, then resumed in the takeover window (once another worker
    claimed the step, which waits meanwhile: where the target has ``after_claim``) and, in another
    schedule, once another worker moved the step on (:data:`PAUSES`); with
    ``terminate``, A's database sessions ended once at every point of ``terminate_points``
    (default ``points``), at a db point in each transaction of ``DB_HITS``. ``passes``: the points
    the target's attempts pass (its declared ones; default the built-in protocol's), where a pause's
    moment must be. ``lease``: the points where a worker holds a lease (default :data:`LEASE_HELD`);
    ``claim``: the point the takeover-window pause resumes at (default ``after_claim`` where the
    target passes it): a target's declaration (``lease_points``, ``claim_point``) gives both."""
    step_names, points = tuple(step_names), tuple(points)
    passes = tuple(HIT_ORDER if passes is None else passes)
    held = frozenset(LEASE_HELD if lease is None else lease)
    if claim is None and "after_claim" in passes:
        claim = "after_claim"
    out = single_crash_schedules(step_names, points) if "kill" in actions else []
    if "pause" in actions:
        for step in step_names:
            for point in points:
                if point in held:
                    for pause in _pauses(claim):
                        out.append(Schedule((Fault("A", point, parse_actions(pause), step),)))
    if "terminate" in actions:
        for step in step_names:
            for point in (points if terminate_points is None else tuple(terminate_points)):
                for hit in (DB_HITS if point in DB_POINTS else (1,)):
                    out.append(Schedule((Fault("A", point, parse_actions("1*terminate"), step, hit),)))
    return out


def _action(point: str) -> str:
    # Once, said in the schedule itself: the pair's text then reads the same whatever the
    # harness's rule for spent faults (a hang, like a kill, is not inherited by a restart).
    return "1*hang" if point == "heartbeat" else "kill"


def _fault(worker: str, step: str, point: str, hit: int = 1) -> Fault:
    return Fault(worker, point, parse_actions(_action(point)), step, hit)


def hit_order(declared: Iterable[str]) -> tuple[str, ...]:
    """The order an attempt passes a target's points in: :data:`HIT_ORDER` when they are all
    built-in ones, else the order the target declared them in (its own points, which only it
    knows the order of, among the built-in ones it passes). The store's own points are in neither:
    every write transaction passes them."""
    declared = tuple(p for p in declared if p not in DB_POINTS)
    return HIT_ORDER if set(declared) <= set(HIT_ORDER) else declared


def _second_hit(p1: str, p2: str, order: Sequence[str]) -> int:
    """The hit of ``p2`` at which a second fault lands after a first at ``p1`` in the same step:
    the second when an attempt passes ``p2`` before (or at) ``p1``. A point outside ``order`` (the
    store's own, which every write transaction passes) waits for the second hit only at ``p1``
    itself; a pair whose second fault is never reached is unknown, never valid."""
    if p1 in order and p2 in order:
        return 2 if order.index(p2) <= order.index(p1) else 1
    return 2 if p2 == p1 else 1


def double_crash_schedules(step_names: Iterable[str], points: Iterable[str], *,
                           forms: Sequence[str] = FORMS, cross_steps: bool = False,
                           order: Sequence[str] | None = None) -> list[tuple[Schedule, float]]:
    """Every ordered pair of faults, each with the restart rule it needs (``same_identity``).

    ``workers``: ``A@s1.p1`` then ``B@s2.p2`` (B starts once A's fault fired). ``hits``:
    ``A@s.p1`` then ``A@s.p2`` again, with every killed worker restarted under its own identity,
    so the restarted A takes the second crash; when A passes ``p2`` before (or at) ``p1`` in an
    attempt, the second fault waits for hit #2 so that it lands after the first. A pair whose
    second fault is never reached (the other worker did that work) is unknown, never valid.
    The ``hits`` form has no pair after a hang at the heartbeat: a hung worker is never killed
    and restarted (the harness ends it only once the run is done), so A could never crash again.
    ``order`` is the order an attempt passes the points in (default: :func:`hit_order` of
    ``points``; a command passes the target's declared points, whatever order ``points`` has).
    """
    step_names, points = tuple(step_names), tuple(points)
    order = hit_order(points if order is None else order)
    out: list[tuple[Schedule, float]] = []
    for s1 in step_names:
        for p1 in points:
            first = _fault("A", s1, p1)
            if "workers" in forms:
                for s2 in (step_names if cross_steps else (s1,)):
                    for p2 in points:
                        out.append((Schedule((first, _fault("B", s2, p2))), 0.5))
            if "hits" in forms and _action(p1) != "1*hang":
                for p2 in points:
                    hit = _second_hit(p1, p2, order)
                    out.append((Schedule((first, _fault("A", s1, p2, hit))), 1.0))
    return out


def repeated_steps(workload: Any) -> tuple[str, ...]:
    """The steps more than one instance of ``workload`` runs: the default steps of depth 2.

    After a crash, recovery of a step passes only the points it needs (a receipt found means no
    call, no receipt, no second commit point), so a second fault at the same step is reached on a
    later instance that runs the step afresh. A step only one instance runs (the amendment) has no
    later instance, so most of its pairs could never fire; name it explicitly to run them.
    """
    counts: dict[str, int] = {}
    for inst in workload.instances:
        for step in inst.steps:
            counts[step.name] = counts.get(step.name, 0) + 1
    return tuple(name for name in workload.step_names if counts[name] > 1) or workload.step_names


def matrix(step_names: Iterable[str], points: Iterable[str], *, depth: int = 1,
           actions: Sequence[str] = ("kill",), terminate_points: Iterable[str] | None = None,
           forms: Sequence[str] = FORMS, cross_steps: bool = False,
           order: Sequence[str] | None = None, lease: Iterable[str] | None = None,
           claim: str | None = None) -> list[Planned]:
    """Depth 1: :func:`single_fault_schedules` with ``actions`` (``order``: the target's declared
    points, where a pause's moment must be); depth 2: :func:`double_crash_schedules` with ``forms``
    (and the target's points in ``order``), each pair with its restart rule."""
    if depth == 1:
        return [Planned(s) for s in single_fault_schedules(step_names, points, actions, terminate_points,
                                                           passes=order, lease=lease, claim=claim)]
    if depth == 2:
        return [Planned(s, same) for s, same in
                double_crash_schedules(step_names, points, forms=forms, cross_steps=cross_steps,
                                       order=order)]
    raise ValueError(f"depth {depth!r}: depth is 1 (single crashes) or 2 (pairs)")


# What the matrix crashes beyond the first hit of each point: nothing (``first``), the hit that ends
# each path a fault-free run took (``paths``, the default), or every hit it reached (``all``).
HIT_MODES = ("first", "paths", "all")


@dataclass(frozen=True)
class Hit:
    """One hit of a point by worker A in a fault-free run.

    ``hit`` is A's count of that point at that step, over every instance, as a fault's ``#hit``
    counts it; ``path`` is every point A had passed on that step of that instance, this one last:
    the first attempt, then a retry or a compensation passing the same points again (a hit outside
    any instance, such as a queue's claim loop, is the path of its point alone).
    """

    step: str
    point: str
    hit: int
    instance: str | None
    path: tuple[str, ...]

    def fault(self) -> Fault:
        """A killed at this hit (hung, at the heartbeat)."""
        return Fault("A", self.point, parse_actions(_action(self.point).removeprefix("1*")), self.step,
                     self.hit)


def hits_of(trace: Iterable[tuple[str | None, str | None, str]]) -> list[Hit]:
    """Worker A's hits, from the (instance, step, point) of each, in the order it passed them; a
    point passed outside any step (no fault with a step can land there) is left out."""
    counts: dict[tuple[str, str], int] = {}
    paths: dict[tuple[str | None, str], tuple[str, ...]] = {}
    out = []
    for instance, step, point in trace:
        if step is None:
            continue
        n = counts[(step, point)] = counts.get((step, point), 0) + 1
        # Outside any instance (a queue's claim loop) passes cannot be told apart: each is the path
        # of its one point, and only --hits all crashes the later ones.
        path = (point,) if instance is None else paths.get((instance, step), ()) + (point,)
        paths[(instance, step)] = path
        out.append(Hit(step, point, n, instance, path))
    return out


def later_hits(hits: Iterable[Hit], steps: Iterable[str], points: Iterable[str], mode: str) -> list[Hit]:
    """The hits past the first of each point and step (which the matrix crashes anyway) that
    ``mode`` crashes: with ``paths``, each hit whose path no earlier hit of that point and step took
    (the same points passed on another instance are the same path); with ``all``, every one."""
    if mode not in HIT_MODES:
        raise ValueError(f"hits {mode!r}: use one of {', '.join(HIT_MODES)}")
    if mode == "first":
        return []
    steps, points = set(steps), set(points)
    seen: set[tuple[str, str, tuple[str, ...]]] = set()
    out = []
    for h in hits:
        new = (h.step, h.point, h.path) not in seen
        seen.add((h.step, h.point, h.path))
        if h.hit > 1 and h.step in steps and h.point in points and (new or mode == "all"):
            out.append(h)
    return out


def path_schedules(hits: Sequence[Hit], limit: int | None = None) -> tuple[list[Schedule], int]:
    """A crash at each of ``hits``, at most ``limit`` of them (None: all), in the order a fault-free
    run reached them, so that the first paths found are the first crashed; and how many were left."""
    chosen = list(hits) if limit is None else list(hits)[:max(limit, 0)]
    return [Schedule((h.fault(),)) for h in chosen], len(hits) - len(chosen)


def in_shard(position: int, k: int, n: int) -> bool:
    """Whether the ``position``-th (0-based) member of a deterministic list is shard ``k`` of ``n``.

    Round robin, so shares differ by at most one member and together cover the list.
    """
    if not 1 <= k <= n:
        raise ValueError(f"shard {k}/{n}: expected 1 <= K <= N")
    return position % n == k - 1


def shard(items: Sequence[T], k: int, n: int) -> list[T]:
    """The members of ``items`` that are shard ``k`` of ``n`` (see :func:`in_shard`)."""
    return [item for i, item in enumerate(items) if in_shard(i, k, n)]


def budget_share(total: int, k: int, n: int) -> int:
    """Shard ``k``'s part of a budget of ``total`` draws split over ``n`` shards (they sum to it)."""
    if not 1 <= k <= n:
        raise ValueError(f"shard {k}/{n}: expected 1 <= K <= N")
    return total // n + (1 if k - 1 < total % n else 0)
