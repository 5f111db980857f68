"""Scenarios: runnable, deterministic crash stories that a person can read, run and learn from.

Each module tells one story in its docstring and has one function, ``run(session, *, target,
seed, store) -> Story``, that builds its runs, sends them through :class:`harness.run.Session`,
narrates what happened and checks the facts the story must show (who was refused with which
fence, how many effects the downstream applied...). A scenario passes only when every run's
verdict is valid *and* every fact held: a story that did not happen proves nothing, even when no
invariant had anything to object to. Interleavings come from pauses, SIGSTOP/SIGCONT and the
gating of the run loop, never from sleeps.

``killpoint scenario NAME`` runs one; ``killpoint scenario --list`` lists them with the mutant
that breaks each story's rule and the invariant that must catch it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, Mapping

from killpoint.errors import UnknownScenario

if TYPE_CHECKING:
    from killpoint.harness.run import Session
    from killpoint.scenarios._story import Story


@dataclass(frozen=True)
class Scenario:
    """One entry of the registry: its module, what it shows, and the mutant that breaks its rule."""

    name: str
    summary: str  # one line
    mutant: str | None  # the mutant (``mutant:NAME``) that breaks the story's rule, if the zoo has one
    caught_by: str | None  # the invariant that must report that mutant

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(f"killpoint.scenarios.{self.name}")

    @property
    def story(self) -> str:
        """The story, as the module's docstring tells it."""
        return (self.module.__doc__ or "").strip()

    def run(self, session: Session, **options: Any) -> Story:
        return self.module.run(session, **options)


_ALL = (
    Scenario("lease_takeover",
             "A is frozen past its lease; B takes over with fence 2; A's late call and late commit "
             "with fence 1 are refused; one effect",
             "local-clock-lease", "stale_writes_rejected"),
    Scenario("dangerous_window",
             "killed after the downstream applied the charge, before the local commit: recovery "
             "finds the receipt by key and records completion; no second effect",
             "random-request-id", "no_duplicate_effects"),
    Scenario("conflicting_intent",
             "the same key with another amount gets 422 and the step ends failed with the conflict "
             "recorded, also across a crash; never a fake success",
             "downstream-ignores-intent", "intent_conflict"),
    Scenario("unsafe_activity",
             "a legacy call with an unknown outcome goes to manual review, stays there across many "
             "workers, and leaves it only by an operator's appended event",
             "auto-resolve-manual", "manual_stable"),
    Scenario("stuck_worker",
             "heartbeat alive, business thread hung: the progress monitor flags it within its bound "
             "and another worker takes over with a new fence",
             "no-heartbeat-progress", "stuck_detected"),
    Scenario("checkpoint_version",
             "a v1 checkpoint read by v2 code (migrated when registered, manual otherwise); corrupt "
             "and forged checkpoints refused, the forged one only with an HMAC key",
             "trust-checkpoint", "checkpoints_honoured"),
    Scenario("same_identity_restart",
             "a worker restarted under its own identity claims a new fence; a twin with the same "
             "identity and the old fence is refused",
             "no-fence-check", "stale_writes_rejected"),
    Scenario("recovery_under_restart",
             "the store and the downstream restart while recovery runs: nothing stranded, nothing "
             "duplicated",
             "random-request-id", "no_duplicate_effects"),
)

# name -> scenario, in the order a reader should meet them; read-only so no caller changes it.
SCENARIOS: Mapping[str, Scenario] = MappingProxyType({s.name: s for s in _ALL})


def get(name: str) -> Scenario:
    """The scenario called ``name``, or :class:`UnknownScenario` naming the valid ones."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise UnknownScenario(f"unknown scenario {name!r}: valid scenarios are "
                              f"{', '.join(SCENARIOS)}") from None


__all__ = ["SCENARIOS", "Scenario", "UnknownScenario", "get"]
