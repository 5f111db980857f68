"""The README's five-minute test: every crash point of my_worker, killed and paused past its lease."""

from my_worker import worker


def test_my_worker_survives_every_crash(killpoint):
    killpoint.matrix(target=worker).assert_valid()
