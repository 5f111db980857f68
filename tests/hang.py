"""The one bound a test puts on a wait for another process: a guard against a hang, never a
performance bound.

CI machines run at load 10-25 on two cores, where a command that takes 20 s on a quiet machine takes
minutes. A test that fails because a loaded machine was slow is a bug in the test, so every
subprocess timeout and every wait-for-a-condition deadline in the suite is this one generous number:
it only ends a test that would otherwise hang CI until its own limit.
"""

import os

HANG_S = 900.0


def not_an_xdist_worker() -> dict[str, str]:
    """This environment without pytest-xdist's worker variables: a pytest session a test starts,
    when this suite runs under ``pytest -n``, is a controller of its own, not a worker (a conftest
    that asks ``PYTEST_XDIST_WORKER`` would take it for one)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}

