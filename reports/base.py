"""What every part of a report shares: the words for an outcome, event links, clipping, and an
event read safely (typed, or as written).

Every string a report shows may come from a run (instance ids, worker ids, payloads, exception
text) and must be treated as hostile by whoever shows it: nothing here escapes anything, the
rendering does, because only it knows the context.
"""

from __future__ import annotations

from typing import Any

from killpoint import vocab
from killpoint.errors import InvalidEvent
from killpoint.harness.events import TypedEvent
from killpoint.harness.history import Event
from killpoint.harness.narrate import describe as describe_event

# ok: took effect; fail: certainly did not; info: unknown (indeterminate); event: a plain fact.
STATUSES = ("ok", "fail", "info", "event")
FIXED_LANES = (vocab.DOWNSTREAM, vocab.STORE, vocab.HARNESS)
DEFAULT_MAX_EVENTS = 2000
DETAIL_CHARS = 600

ACCEPTED = vocab.ACCEPTED_TRANSITIONS | {vocab.RECEIPT_RECORDED}
OK_OUTCOMES = {vocab.APPLIED, vocab.REPLAY}
WORKER_SKIPPED = {vocab.START, vocab.FINISH}  # the harness lane shows spawn and exit instead
# The failpoint actions the timeline draws apart (chaos.actions spells them so).
PAUSE = "pause"
KILL = "kill"



def link(index: int) -> str:
    """The anchor id of an event: its row in the event table."""
    return f"e{index}"


def verdict_word(valid: bool | None) -> str:
    return {True: "valid", False: "violated", None: "unknown"}[valid]


def clip(text: str, limit: int) -> str:
    """Shorten text for display; a 10 kB name must not make a report unreadable."""
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "\u2026"


def describe(e: Event) -> str:
    """A one-line description of any event, for proof links and tooltips: its link id, its process,
    then the event in words."""
    return f"e{e.index} {e.process} {describe_event(e)}"


def typed(e: Event) -> TypedEvent | None:
    """The event's typed form; None for one not in the vocabulary (the report shows it as written)."""
    try:
        return e.typed
    except InvalidEvent:
        return None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
