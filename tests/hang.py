"""The one bound a test puts on a wait for another process: a guard against a hang, never a
performance bound.

CI machines run at load 10-25 on two cores, where a command that takes 20 s on a quiet machine takes
minutes. A test that fails because a loaded machine was slow is a bug in the test, so every
subprocess timeout and every wait-for-a-condition deadline in the suite is this one generous number:
it only ends a test that would otherwise hang CI until its own limit.
"""

HANG_S = 900.0
