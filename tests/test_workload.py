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


def _order(kind="plain", **changes):
    values = {"customer": "C", "email": "c@example.com", "sku": "SKU-ABCD-123", "qty": 1,
              "amount": 500, "card": "tok_abcd", "kind": kind}
    return {**values, **({"amended_amount": 600} if kind == "amended" else {}), **changes}


_KINDS = ("plain", "declined", "amended", "flaky", "tampered")


@pytest.mark.parametrize("name, kept", [
    ("orders", []),
    ("orders", [{"customer": 5}]),  # before: KeyError 'sku', exit 3 every time
    ("orders", [_order(k) for k in _KINDS[:4]]),  # one order short: IndexError
    ("orders", [_order(k) for k in _KINDS] + [_order()]),  # one too many
    ("orders", [_order(k) for k in reversed(_KINDS)]),
    ("orders", [_order(k, qty="1") for k in _KINDS]),
    ("orders", [_order(k, amount=True) for k in _KINDS]),
    ("orders", [_order(k, amended_amount=None) for k in _KINDS]),
    ("plain", [{"customer": "C", "sku": "S", "qty": 1, "amount": 5, "card": "t"}]),
    ("plain", [{"customer": "C", "sku": "S", "qty": 1, "amount": 5}] * 3),
])
def test_a_kept_entry_of_the_wrong_shape_is_drawn_again_and_the_file_rewritten(cache_home, name, kept):
    """Protects the cache's promise that a damaged kept file is drawn again: an entry that is
    valid JSON of another shape (too few or too many items, a field missing, of another type, in
    another order) failed to build the workload on every command (an infrastructure failure,
    exit 3, IndexError or KeyError) or built another workload than the seed's."""
    fresh = _seen(WORKLOADS[name](5))
    (path,) = glob.glob(str(cache_home / "killpoint" / "faker" / f"{name}-*.json"))
    with open(path) as fh:
        drawn = json.load(fh)["5"]
    with open(path, "w") as fh:
        json.dump({"5": kept}, fh)
    assert _seen(WORKLOADS[name](5)) == fresh
    with open(path) as fh:
        assert json.load(fh)["5"] == drawn  # the file healed


def test_a_command_heals_a_kept_entry_of_the_wrong_shape_instead_of_failing(cache_home):
    """The tester's case, through the command line: {"11": []} kept for the seed made every
    `killpoint replay ... --seed 11` exit 3 with IndexError."""
    argv = [sys.executable, "-m", "killpoint.harness.cli", "replay", "A@charge.after_call:kill",
            "--seed", "11", "--json", "-q"]
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    first = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    (path,) = glob.glob(str(cache_home / "killpoint" / "faker" / "orders-*.json"))
    for damage in ('{"11": []}', '{"11": [{"customer": 5}]}'):
        with open(path, "w") as fh:
            fh.write(damage)
        again = subprocess.run(argv, env=env, capture_output=True, text=True)
        assert again.returncode == 0 and "infrastructure" not in again.stderr, again.stderr
        assert json.loads(again.stdout)["valid"] is True


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
