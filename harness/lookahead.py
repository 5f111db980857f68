"""Exploration side by side: the runs of the examples Hypothesis will draw next, ``--jobs`` at a time.

Hypothesis hands its test one example at a time and decides the next from what the last one did,
so its loop cannot be handed a batch. But until the first failure, what it did is always "passed",
and what Hypothesis draws then is a function of the seed and the example database alone (no
clock, no outcome): a *dry pass* -- the same search, with a test that runs nothing and a database
it may only read -- draws the very sequence the real search will draw while nothing fails. The
real search then runs as before, one example at a time, but an example that is the next one of
that sequence is taken from runs made ahead, a batch of them side by side
(:meth:`Session.run_many <killpoint.harness.run.Session.run_many>`). Results are used in the
order drawn, so the search sees what a one-at-a-time search sees, and the same seed gives the
same counterexample with any number of jobs.

From the first failure on (Hypothesis shrinks it, each shrink step decided by the last), the
search leaves the sequence and runs one example at a time; runs made ahead and not reached are
dropped uncounted. Confirmation replays (:mod:`killpoint.harness.confirm`) go side by side again.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from killpoint.harness.run import RunConfig, RunResult, Session

# Runs made ahead per job in the first batch; each next batch is twice the last, up to the most.
# Small first: a bug is mostly found early, and the runs after it are wasted; larger later: a long
# search without a failure pays each batch's runner start-up fewer times.
AHEAD_PER_JOB = 2
MOST_AHEAD_PER_JOB = 16


# The most examples a dry pass draws: it costs milliseconds an example (about 9 ms on a loaded
# runner), and it ran to the whole budget before the first run, so a budget of 5 000 waited 46 s
# and a larger one never started. The examples after these run one at a time.
PLAN_MOST = 500


class _Planned(BaseException):
    """Ends a dry pass that has drawn enough: a BaseException, which Hypothesis lets through as it
    lets a Ctrl-C through (an Exception would be a failure for it to shrink)."""


def drawn(search: Callable[[Callable[[Any], None]], None], most: int = PLAN_MOST) -> list[Any]:
    """The first ``most`` examples ``search`` draws when every one passes (those a search with a
    larger budget draws first too). ``search(test)`` runs the Hypothesis search with ``test`` as
    the test, and a database it may only read."""
    examples: list[Any] = []

    def test(example: Any) -> None:  # a function of its own: Hypothesis reads its signature
        examples.append(example)
        if len(examples) >= most:
            raise _Planned

    try:
        search(test)
    except _Planned:
        pass
    return examples


def key(experiment: Any) -> tuple[str, float]:
    """An example as the search runs it: its schedule's text and its restart rule."""
    return str(experiment.schedule), float(experiment.same_identity)


class Lookahead:
    """Runs of the planned examples, made in batches of ``jobs * AHEAD_PER_JOB`` and then twice
    the last (up to ``jobs * MOST_AHEAD_PER_JOB``), handed out in order.

    # Invariant: ``position`` is the index in ``plan`` of the next example the search may take
    # from here; ``results`` holds runs made for plan indexes >= ``position`` only.
    """

    def __init__(self, session: "Session", config: "RunConfig", plan: Sequence[Any], jobs: int) -> None:
        self.session = session
        self.config = config
        self.plan = list(plan)
        self.jobs = jobs
        self.position = 0
        self.results: dict[int, "RunResult"] = {}
        self.batch = jobs * AHEAD_PER_JOB  # the size of the next batch
        self.made = 0  # runs made ahead, reached or not
        self.dropped = 0  # runs made ahead that the search never reached

    def take(self, experiment: Any) -> "RunResult | None":
        """The run of ``experiment`` if it is the next planned one (made now with the next batch,
        if not made yet); None when the search has left the plan (it runs the example itself)."""
        if self.position >= len(self.plan) or key(self.plan[self.position]) != key(experiment):
            self.leave()
            return None
        if self.position not in self.results:
            batch = range(self.position, min(len(self.plan), self.position + self.batch))
            self.batch = min(2 * self.batch, self.jobs * MOST_AHEAD_PER_JOB)
            configs = [dataclasses.replace(self.config, schedule=self.plan[i].schedule,
                                           same_identity=self.plan[i].same_identity) for i in batch]
            for i, result in zip(batch, self.session.run_many(configs, jobs=self.jobs)):
                self.results[i] = result
                self.made += 1
        result = self.results.pop(self.position)
        self.position += 1
        return result

    def leave(self) -> None:
        """The search left the plan (a failure, or a draw the dry pass did not make): from here
        every example runs on its own, and the runs made ahead are dropped."""
        self.position = len(self.plan)
        self.dropped += len(self.results)
        self.results.clear()


__all__ = ["AHEAD_PER_JOB", "MOST_AHEAD_PER_JOB", "PLAN_MOST", "Lookahead", "drawn", "key"]
