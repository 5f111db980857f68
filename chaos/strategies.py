"""Hypothesis strategies that draw schedules, so a search can go far beyond the single-crash matrix.

Every draw shrinks towards something a person reads quickly: fewer faults, worker ``A``, a named
step, the first hit, ``kill`` before the subtler actions, earlier points before later ones. So a
failure found among three faults with pauses and sleeps ends as the one or two faults that matter.

Actions are chosen so that a correct worker stays correct and the verdict stays judgeable:

* ``kill`` -- SIGKILL at the point (at ``in_call``: the downstream applied it, the answer is lost);
* ``1*pause`` -- SIGSTOP until another worker moved the step on, so the worker wakes up past its
  lease (once: a pause at every hit would stall every step the worker touches); given the target's
  moments, ``1*pause(until=MOMENT)`` too: back in the takeover window (the new holder at its claim
  point) or once the lease lapsed (``lapse``);
* ``1*hang`` -- the business thread blocks for good while the heartbeat goes on (once: a bare
  ``hang`` is not spent like a kill, so every restart under the same identity would hang again
  and the run could never finish);
* ``1*sleep(MS)`` -- a stall of the business thread while the heartbeat goes on. Given the run's
  lease TTL and stuck bound (:func:`stall_durations`), stalls are drawn below the lease, past it
  but short of the stuck bound, and well past the stuck bound: the long ones are what leases and the
  stuck-worker monitor exist for (the monitor frees the lease, another worker takes over, the sleeper wakes up stale).
  Without them, a short delay of at most :data:`MAX_SLEEP_MS`.
"""

from __future__ import annotations

from typing import Sequence

from hypothesis import strategies as st

from killpoint.chaos.actions import Chain, parse as parse_actions
from killpoint.chaos.points import DEFAULT_POINTS
from killpoint.chaos.schedule import Fault, Schedule

MAX_SLEEP_MS = 100
MAX_HIT = 3

# In the order a shrink prefers them.
_PLAIN_ACTIONS = ("kill", "1*pause", "1*hang")


def stall_durations(lease_ttl_ms: float, stuck_bound_ms: float) -> tuple[int, ...]:
    """Stalls relative to a run's bounds, shortest first: a quarter and a half of the lease, halfway
    from the lease to the stuck bound, and one and a half and three times the stuck bound.

    Each keeps clear of the bounds. A stall that ends where the stuck monitor may flag it (from the
    stuck bound to a check period past it) is a race between the sleeper waking and the monitor
    looking, settled by milliseconds of real time: the same seed could then give two verdicts.
    (Twice the lease was one of these once leases became 30 s against a 60 s stuck bound.)"""
    wanted = (lease_ttl_ms / 4, lease_ttl_ms / 2, (lease_ttl_ms + stuck_bound_ms) / 2,
              stuck_bound_ms * 1.5, stuck_bound_ms * 3)
    return tuple(sorted({max(1, int(round(ms))) for ms in wanted}))


def actions(stalls_ms: Sequence[int] | None = None, moments: Sequence[str] = ()) -> st.SearchStrategy[Chain]:
    """A failpoint action chain: kill, or a one-off pause (resumed once another worker moved the step
    on, or at one of ``moments``: ``pause(until=MOMENT)``), hang or sleep (one of ``stalls_ms``, or a
    short one of at most :data:`MAX_SLEEP_MS`)."""
    plain = st.sampled_from(_PLAIN_ACTIONS[:2] + tuple(f"1*pause(until={m})" for m in moments) + _PLAIN_ACTIONS[2:])
    durations = st.sampled_from(tuple(stalls_ms)) if stalls_ms else st.integers(1, MAX_SLEEP_MS)
    sleep = durations.map(lambda ms: f"1*sleep({ms})")
    return st.one_of(plain, sleep).map(parse_actions)


def faults(workers: Sequence[str], steps: Sequence[str],
           points: Sequence[str] = DEFAULT_POINTS,
           stalls_ms: Sequence[int] | None = None, moments: Sequence[str] = ()) -> st.SearchStrategy[Fault]:
    """One fault: a worker, a point at a named step (or at any step), a hit number, an action."""
    if not workers or not points:
        raise ValueError("a fault needs at least one worker name and one crash point")
    step = st.one_of(st.sampled_from(tuple(steps)), st.none()) if steps else st.none()
    return st.builds(lambda worker, point, chain, step, hit: Fault(worker, point, chain, step, hit),
                     st.sampled_from(tuple(workers)), st.sampled_from(tuple(points)), actions(stalls_ms, moments),
                     step, st.integers(1, MAX_HIT))


def schedules(workers: Sequence[str], steps: Sequence[str], *, points: Sequence[str] = DEFAULT_POINTS,
              max_faults: int = 3, stalls_ms: Sequence[int] | None = None,
              moments: Sequence[str] = ()) -> st.SearchStrategy[Schedule]:
    """A schedule of one to ``max_faults`` faults, no two at the same worker, step, point and hit
    (``moments``: where a drawn pause may come back besides the plain pause's moment).

    Two faults at the same place would compete for one hit, and only the first could ever fire.
    """
    if max_faults < 1:
        raise ValueError(f"max_faults must be at least 1, not {max_faults}")
    return st.lists(faults(workers, steps, points, stalls_ms, moments), min_size=1, max_size=max_faults,
                    unique_by=lambda f: (f.worker, f.step, f.point, f.hit)).map(
        lambda fs: Schedule(tuple(fs)))


__all__ = ["MAX_HIT", "MAX_SLEEP_MS", "actions", "faults", "schedules", "stall_durations"]
