"""The built-in workloads' Faker data: drawn from the seed once, then kept in the user's cache."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from killpoint.harness.workload import WORKLOADS


def _seen(workload) -> tuple:
    return repr(workload.instances), repr(workload.checkpoints()), repr(workload.downstream_config())


@pytest.fixture()
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("KILLPOINT_NO_CACHE", raising=False)
    return tmp_path / "cache"


@pytest.mark.parametrize("name", ["orders", "plain", "single"])
def test_kept_draws_give_the_workload_faker_gives(name, cache_home, monkeypatch):
    """Protects the seed's meaning: a workload built from the kept values is the one Faker draws for
    that seed (first build, later build, and a build with the cache off agree), and a later build
    does not ask Faker at all (the 130 ms a command saves)."""
    first = _seen(WORKLOADS[name](3))
    kept = glob.glob(str(cache_home / "killpoint" / "faker" / "*.json"))
    assert len(kept) == 1, kept
    import faker

    def refuse(*args, **kwargs):
        raise AssertionError("Faker asked again for values already kept")

    monkeypatch.setattr(faker, "Faker", refuse)
    assert _seen(WORKLOADS[name](3)) == first
    monkeypatch.undo()
    monkeypatch.setenv("KILLPOINT_NO_CACHE", "1")
    assert _seen(WORKLOADS[name](3)) == first
    assert _seen(WORKLOADS[name](4)) != first  # another seed, other data


def test_a_damaged_kept_file_is_drawn_again_and_replaced(cache_home):
    fresh = _seen(WORKLOADS["orders"](5))
    (path,) = glob.glob(str(cache_home / "killpoint" / "faker" / "*.json"))
    for damage in ('{"not": "a list"}', "[1, 2", ""):
        with open(path, "w") as fh:
            fh.write(damage)
        assert _seen(WORKLOADS["orders"](5)) == fresh
        with open(path) as fh:
            assert json.load(fh)["5"][0]["kind"] == "plain"


def test_a_cache_folder_that_cannot_be_written_is_only_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setenv("KILLPOINT_NO_CACHE", "1")
    expected = _seen(WORKLOADS["plain"](9))
    monkeypatch.delenv("KILLPOINT_NO_CACHE")
    assert _seen(WORKLOADS["plain"](9)) == expected
    assert os.path.isfile(blocker)


def test_the_kept_file_is_found_again_by_another_process_and_holds_the_latest_seeds(cache_home):
    """Protects the saving itself: a command in another process finds the file this one wrote (its
    name carries no address of this process), and an exploration's many seeds keep one file of the
    latest 64, not a file per seed."""
    code = "from killpoint.harness.workload import WORKLOADS; WORKLOADS['plain'](3); WORKLOADS['orders'](3)"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert sorted(os.path.basename(p).split("-")[0]
                  for p in glob.glob(str(cache_home / "killpoint" / "faker" / "*.json"))) == ["orders", "plain"]
    for seed in range(100, 170):
        WORKLOADS["plain"](seed)
    (path,) = glob.glob(str(cache_home / "killpoint" / "faker" / "plain-*.json"))
    with open(path) as fh:
        kept = json.load(fh)
    assert list(kept) == [str(s) for s in range(106, 170)]
