"""The failpoint action grammar, in the spirit of fail-rs and gofail.

    chain := term ("->" term)*
    term  := [P "%"] [N "*"] action
    action:= "kill" | "pause" ["(until=" MOMENT ")"] | "terminate" | "hang" | "off" | "sleep(" MS ")"
    MOMENT:= POINT | "lapse"

A term with a count applies to that many hits, then the chain moves on; a term without a count
applies to every later hit. ``2*off->kill``: the first two hits do nothing, the third kills.
``P%`` makes a term fire on a hit with that probability (drawn from the run's seed); a hit that does
not fire still uses up one of the term's count.

``pause(until=MOMENT)`` says when the frozen worker comes back: when another worker reaches crash
point ``MOMENT`` of the same step (``after_claim``: the new holder's claim was granted, and it waits
there while the frozen worker goes on), or, with ``lapse``, once its lease has lapsed and nobody has
taken the step yet. A plain ``pause`` comes back once another worker has moved its step on (see
:mod:`killpoint.harness.pauses` for every way a pause ends).

``terminate`` cuts the worker's connections to a PostgreSQL store: the harness ends their server
backends (``pg_terminate_backend``) while the worker waits at the point, then lets it go on, and its
next store call meets a dead connection. Only a store with server sessions has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from killpoint.errors import InvalidAction as InvalidAction, shown

ACTIONS = ("kill", "pause", "terminate", "hang", "off", "sleep")
_ONE_OF = "kill, pause, pause(until=MOMENT), terminate, hang, off, sleep(MS)"
# The resume moment that is not a crash point: the frozen worker's lease has lapsed, nobody took it.
LAPSE = "lapse"
_MOMENT = re.compile(r"until=(?P<moment>[A-Za-z][A-Za-z0-9_-]*)")


@dataclass(frozen=True)
class Term:
    action: str  # one of ACTIONS
    count: int | None = None  # None: every later hit
    probability: float | None = None  # percent, None: always
    arg: int | None = None  # sleep milliseconds
    until: str | None = None  # pause: the resume moment (a crash point, or LAPSE); None: moved on

    def __str__(self) -> str:
        text = f"sleep({self.arg})" if self.action == "sleep" else self.action
        if self.until is not None:
            text = f"{text}(until={self.until})"
        if self.count is not None:
            text = f"{self.count}*{text}"
        if self.probability is not None:
            text = f"{_fmt_percent(self.probability)}%{text}"
        return text


def _fmt_percent(p: float) -> str:
    return str(int(p)) if p == int(p) else repr(p)


@dataclass(frozen=True)
class Chain:
    terms: tuple[Term, ...]

    def __str__(self) -> str:
        return "->".join(str(t) for t in self.terms)

    def term_for(self, hit: int) -> Term | None:
        """The term that governs the ``hit``-th hit (1-based) of the point, or None past the chain."""
        seen = 0
        for term in self.terms:
            if term.count is None:
                return term
            seen += term.count
            if hit <= seen:
                return term
        return None

    @property
    def moments(self) -> tuple[str, ...]:
        """The resume moments the chain's pauses name (crash points, or :data:`LAPSE`)."""
        return tuple(t.until for t in self.terms if t.until is not None)


# ASCII digits only: a count, percentage or sleep written in other scripts' digits is refused
# rather than read one way here and shown another in the reproduce line.
_TERM = re.compile(
    r"^(?:(?P<p>[0-9]+(?:\.[0-9]+)?)%)?(?:(?P<n>[0-9]+)\*)?(?P<action>[a-z_]+)(?:\((?P<arg>[^)]*)\))?$")
# The longest sleep a schedule may ask for: a year, as the longest timing (a longer one overflows
# the clocks' arithmetic).
LONGEST_SLEEP_MS = 31_536_000_000


def parse_term(text: str) -> Term:
    m = _TERM.match(text.strip())
    if not m:
        raise InvalidAction(f"cannot read failpoint action {shown(text)}: expected [P%][N*]ACTION "
                            f"with ACTION one of {_ONE_OF}")
    action, arg = m["action"], m["arg"]
    if action not in ACTIONS:
        # "in TEXT" only where it says more than the action (a count, a chain): a long bad value
        # is named once, not once per part of the message.
        where = f" in {shown(text)}" if text.strip() != action else ""
        raise InvalidAction(f"unknown failpoint action {shown(action)}{where}: use one of {_ONE_OF}")
    if action == "sleep":
        if arg is None or not re.fullmatch(r"[0-9]+", arg.strip()) or int(arg) > LONGEST_SLEEP_MS:
            raise InvalidAction(f"sleep needs a whole number of milliseconds up to {LONGEST_SLEEP_MS} "
                                f"(a year), as in sleep(50), not {shown(text)}")
        arg_value: int | None = int(arg)
        until = None
    elif action == "pause" and arg is not None:
        moment = _MOMENT.fullmatch(arg.strip())
        if moment is None:
            raise InvalidAction(f"pause takes a resume moment, as in pause(until=after_claim) (a crash "
                                f"point another worker reaches on the same step) or pause(until=lapse), "
                                f"not {shown(text)}")
        arg_value, until = None, moment["moment"]
    else:
        if arg is not None:
            raise InvalidAction(f"{action!r} takes no argument, in {shown(text)}")
        arg_value, until = None, None
    count = int(m["n"]) if m["n"] is not None else None
    if count == 0:
        raise InvalidAction(f"a count must be at least 1, in {shown(text)}")
    p = float(m["p"]) if m["p"] is not None else None
    if p is not None and not 0 < p <= 100:
        raise InvalidAction(f"a probability must be in (0, 100], in {shown(text)}")
    return Term(action, count, p, arg_value, until)


def parse(text: str) -> Chain:
    """Parse an action chain such as ``2*off->kill``; raise :class:`InvalidAction` naming the bad part."""
    if not text or not text.strip():
        raise InvalidAction(f"empty failpoint action: use one of {_ONE_OF}")
    terms = tuple(parse_term(part) for part in text.split("->"))
    for term in terms[:-1]:
        if term.count is None:
            raise InvalidAction(f"{shown(str(term))} applies to every hit, so nothing after it in "
                                f"{shown(text)} could run: give it a count, as in 2*{term}")
    return Chain(terms)
