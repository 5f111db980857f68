"""What is wrong with a value a user gave, in the same words wherever it was given.

The command line (``--points``, ``--steps``, ``--actions``, ``--workers``, ``--seed``), the pytest
marker and ``killpoint.matrix()`` take the same values; each says what is wrong with one through
these functions, behind its own prefix naming where the value came from (``--steps: ...``,
``@pytest.mark.killpoint(steps=('nope',)): ...``). Each returns the message, or None for a good value.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from killpoint.errors import shown

MAX_WORKERS = 26  # worker identities A to Z
WORKERS_WORDS = f"use a number of workers from 1 to {MAX_WORKERS}"
SEED_WORDS = "give a whole number in ASCII digits (a leading minus allowed)"


def unknown_points(chosen: Iterable[str], valid: Sequence[str]) -> str | None:
    bad = [p for p in chosen if p not in valid]
    if not bad:
        return None
    return f"unknown crash point {', '.join(map(shown, bad))}; valid names are {', '.join(valid)}"


def unknown_steps(chosen: Iterable[str], workload: str, steps: Sequence[str]) -> str | None:
    bad = [s for s in chosen if s not in steps]
    if not bad:
        return None
    return f"unknown step {', '.join(map(shown, bad))}; the {workload} workload's steps are {', '.join(steps)}"


def unknown_actions(chosen: Sequence[Any], allowed: Sequence[str]) -> str | None:
    """Also an empty item (``kill,``): a slip, never a quiet "and nothing"."""
    bad = [a for a in chosen if a not in allowed]
    if bad:
        return f"unknown action {', '.join(map(shown, bad))}; use any of {', '.join(allowed)}"
    if not chosen:
        return f"no action given; use any of {', '.join(allowed)}"
    return None


def action_names(value: Sequence[Any] | str, allowed: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """``actions=`` as ``--actions`` reads it (a comma-separated string or a sequence of names), and
    what is wrong with it (:func:`unknown_actions`; an empty item such as ``kill,`` too)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = tuple(a.strip() for a in items if isinstance(a, str) and a.strip())
    return names, unknown_actions(names if len(names) == len(items) else (*names, ""), allowed)


def bad_workers(value: Any) -> str | None:
    return None if type(value) is int and 1 <= value <= MAX_WORKERS else WORKERS_WORDS


def bad_seed(value: Any) -> str | None:
    return None if type(value) is int else SEED_WORDS


__all__ = ["MAX_WORKERS", "SEED_WORDS", "WORKERS_WORDS", "action_names", "bad_seed", "bad_workers",
           "unknown_actions", "unknown_points", "unknown_steps"]
