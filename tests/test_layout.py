"""The library is the core and the commands are thin callers: which module may import which, the
schedule generator and exploration as library values, the reproduce line as a method of the run's
configuration, and the one redaction that keeps a password out of everything killpoint prints or
writes (an end-to-end run through the real CLI on PostgreSQL, every output grepped)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from hang import HANG_S

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cret"


def _imports(path: Path) -> list[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    tree = ast.parse(path.read_text())
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return found


def _files(*folders: str) -> list[Path]:
    return [p for folder in folders for p in sorted((ROOT / folder).rglob("*.py"))]


# -- which module may import which ------------------------------------------------------------------
def test_no_library_module_imports_the_command_line_layer():
    # harness/commands and harness/cli.py call the library; nothing else calls them (but the
    # console script's entry, killpoint/_main.py, which is the command line's first step).
    offenders = []
    for path in _files("harness", "reports", "chaos", "scenarios", "killpoint"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("harness/commands/") or rel in ("harness/cli.py", "killpoint/_main.py"):
            continue
        bad = [m for m in _imports(path) if m.startswith(("killpoint.harness.commands", "killpoint.harness.cli"))]
        if bad:
            offenders.append((rel, bad))
    assert offenders == []


def test_chaos_is_the_bottom_layer_and_imports_nothing_of_the_harness_or_reports():
    offenders = [(p.name, m) for p in _files("chaos") for m in _imports(p)
                 if m.startswith(("killpoint.harness", "killpoint.reports", "killpoint.scenarios"))]
    assert offenders == []


def test_checkpoint_and_workload_do_not_import_each_other():
    assert not [m for m in _imports(ROOT / "harness" / "checkpoint.py") if m.startswith("killpoint.harness.workload")]
    assert "killpoint.harness.checkpoint" in _imports(ROOT / "harness" / "workload.py")


def test_the_supervisor_layers_import_only_the_layers_below_them():
    # The Supervisor is built in layers, one module each (harness/supervise.py says which): a layer
    # imports those it builds on and never one above, and the forked child's code, the identities
    # and the disk test import no layer at all (the CLI checks a schedule without the supervisor).
    below = {"starts": set(), "grace": {"starts"}, "restarts": {"starts"},
             "pauses": {"starts", "grace", "restarts"},
             "supervise": {"starts", "grace", "restarts", "pauses"},
             "child": set(), "identities": set(), "disk": set()}
    layers = {"starts", "grace", "restarts", "pauses", "supervise"}
    found = {name: {m.rsplit(".", 1)[1] for m in _imports(ROOT / "harness" / f"{name}.py")
                    if m.startswith("killpoint.harness.") and m.rsplit(".", 1)[1] in layers}
             for name in below}
    assert {name: sorted(found[name] - below[name]) for name in below} == {name: [] for name in below}


# -- the schedule generator -------------------------------------------------------------------------
def test_the_generator_gives_the_matrix_the_command_runs_in_its_order():
    from killpoint.chaos import generator

    single = generator.matrix(["charge"], ["after_call", "heartbeat"])
    assert [str(p.schedule) for p in single] == ["A@charge.after_call:kill", "A@charge.heartbeat:hang"]
    assert all(p.overrides() == {} for p in single)
    paused = generator.matrix(["charge"], ["after_call"], actions=("kill", "pause"))
    assert [str(p.schedule) for p in paused] == ["A@charge.after_call:kill",
                                                 "A@charge.after_call:1*pause(until=after_claim)",
                                                 "A@charge.after_call:1*pause"]
    pairs = generator.matrix(["charge"], ["after_call", "before_commit"], depth=2)
    assert len(pairs) == 2 * 2 * 2  # points x points x forms
    text = {str(p.schedule): p.overrides() for p in pairs}
    assert text["A@charge.after_call:kill,B@charge.before_commit:kill"] == {"same_identity": 0.5}
    assert text["A@charge.before_commit:kill,A@charge.after_call#2:kill"] == {"same_identity": 1.0}
    with pytest.raises(ValueError, match="depth"):
        generator.matrix(["charge"], ["after_call"], depth=3)


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_shards_partition_a_list_and_budget_shares_sum_to_the_budget(n):
    from killpoint.chaos.generator import budget_share, shard

    items = list(range(23))
    shares = [shard(items, k, n) for k in range(1, n + 1)]
    assert sorted(x for s in shares for x in s) == items
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert sum(budget_share(100, k, n) for k in range(1, n + 1)) == 100
    with pytest.raises(ValueError, match=f"{n + 1}/{n}"):
        shard(items, n + 1, n)


# -- the reproduce line -------------------------------------------------------------------------------
def test_the_reproduce_line_is_a_method_of_the_run_configuration_and_hides_the_password():
    from killpoint import chaos
    from killpoint.harness.run import RunConfig

    config = RunConfig(schedule=chaos.parse("A@charge.after_call:kill"), target="mutant:no-fence-check",
                       seed=4, workers=3, store=f"postgresql://postgres:{SECRET}@db:5432/test",
                       same_identity=1.0)
    line = config.reproduce_command()
    assert line == ("killpoint replay A@charge.after_call:kill --target mutant:no-fence-check --seed 4 "
                    "--workers 3 --store 'postgresql://postgres:***@db:5432/test' --same-identity 1")
    assert RunConfig().reproduce_command() == "killpoint replay '' --target reference --seed 0"


def test_a_reproduce_line_says_what_a_command_line_cannot_name():
    """A workload built in code, or a target defined inside a function, has no name the command
    line can import. Before, a Workload named like a built-in one lost its --workload (the line
    replayed the built-in one without a word), and an inner function's line failed to import."""
    import dataclasses

    from killpoint import chaos
    from killpoint.harness.run import RunConfig
    from killpoint.harness.workload import Workload, resolve_workload

    schedule = chaos.parse("A@charge.after_call:kill")
    single = resolve_workload("single", 0)
    other = Workload("single", (dataclasses.replace(single.instances[0], id="job-9"),), single.resources)
    line = RunConfig(schedule=schedule, workload_spec=other).reproduce_command()
    assert line == ("killpoint replay A@charge.after_call:kill --target reference --seed 0 --workload single"
                    "  # the workload single was built in code: give it as pkg.module:function to replay this run")
    # the very workload its name gives: a plain line (and none at all for the target's default)
    assert RunConfig(schedule=schedule, workload_spec=single).reproduce_command() == \
        "killpoint replay A@charge.after_call:kill --target reference --seed 0 --workload single"
    assert RunConfig(schedule=schedule, workload_spec=resolve_workload("orders", 0)).reproduce_command() == \
        "killpoint replay A@charge.after_call:kill --target reference --seed 0"

    def inner(ctx):
        pass

    line = RunConfig(schedule=schedule, target=inner).reproduce_command()
    assert line.endswith(".<locals>.inner is defined inside a function: give it as pkg.module:function "
                         "to replay this run"), line


# -- one redaction ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, shown", [
    (f"postgresql://postgres:{SECRET}@127.0.0.1:5432/test", "postgresql://postgres:***@127.0.0.1:5432/test"),
    (f"postgres://:{SECRET}@h/db", "postgres://:***@h/db"),
    (f"postgresql://u:p@{SECRET}@h/db", "postgresql://u:***@h/db"),  # an '@' inside the password
    (f"postgresql://u@h/db?password={SECRET}", "postgresql://u@h/db?password=***"),
    (f"postgresql://u@h/db?sslmode=disable&password={SECRET}&x=1",
     "postgresql://u@h/db?sslmode=disable&password=***&x=1"),
    (f"host=h password={SECRET} dbname=test", "host=h password=*** dbname=test"),
    (f"host=h password='{SECRET} with space' dbname=test", "host=h password=*** dbname=test"),
    (f"PGPASSWORD={SECRET} killpoint matrix", "PGPASSWORD=*** killpoint matrix"),
    (f"--store 'postgresql://postgres:{SECRET}@h/test' --seed 1",
     "--store 'postgresql://postgres:***@h/test' --seed 1"),
    (f'{{"store": "postgresql://u@h/db?password={SECRET}"}}', '{"store": "postgresql://u@h/db?password=***"}'),
    (f"postgresql://u@h/db?sslmode=disable&amp;password={SECRET}", "postgresql://u@h/db?sslmode=disable&amp;password=***"),
])
def test_redact_hides_the_password_in_every_form_a_connection_string_takes(text, shown):
    from killpoint.harness.redact import redact

    assert redact(text) == shown
    assert SECRET not in redact(text)


@pytest.mark.parametrize("text", ["http://127.0.0.1:5555/runs/r1/ledger", "postgresql://postgres@h:5432/test",
                                  "sqlite", "no password: here", "A@charge.after_call:kill"])
def test_redact_leaves_text_without_a_password_as_it_is(text):
    from killpoint.harness.redact import redact

    assert redact(text) == text


def test_the_store_and_the_reports_use_the_one_redaction():
    from killpoint.harness import redact as one
    from killpoint.harness.commands import summary
    from killpoint.harness.store import postgres
    from killpoint.reports import index, model

    assert summary.redact is postgres.redact is model.redact is index.redact is one.redact


def _with_password(dsn: str, form: str) -> str:
    parts = urlsplit(dsn)
    user = (parts.username or "postgres")
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    if form == "userinfo":
        return urlunsplit((parts.scheme, f"{user}:{SECRET}@{host}", parts.path, parts.query, ""))
    query = (parts.query + "&" if parts.query else "") + f"password={SECRET}"
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, query, ""))


@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_replay_on_a_store_url_with_a_password_prints_and_writes_it_nowhere(pg_dsn, tmp_path, form):
    # The real CLI in a process of its own: stdout, stderr, the JSON and every report file grepped.
    store = _with_password(pg_dsn, form)
    report_dir = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "replay", "A@charge.after_call:kill",
                           "--store", store, "--json", "--report", "always", "--report-dir", str(report_dir)],
                          capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["valid"] is True and out["report"], out
    files = [p for p in report_dir.rglob("*") if p.is_file()]
    assert len(files) >= 2  # the index and the run's page
    assert SECRET not in proc.stdout and SECRET not in proc.stderr
    for path in files:
        assert SECRET not in path.read_text(errors="replace"), path
    # The store still reads as the one the user gave, with its password hidden.
    page = "".join(p.read_text(errors="replace") for p in files)
    assert "password=***" in page if form == "query" else "postgres:***@" in page


def test_an_unreachable_store_with_a_password_is_refused_without_showing_it(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "replay", "A@charge.after_call:kill",
                           "--store", f"postgresql://postgres:{SECRET}@127.0.0.1:1/test?password={SECRET}"],
                          capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path)
    assert proc.returncode == 3  # nobody answers on port 1: the infrastructure's failure
    assert "127.0.0.1:1" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert SECRET not in proc.stdout + proc.stderr


# -- exploration as a library value ------------------------------------------------------------------
def test_exploration_returns_a_value_with_the_minimal_counterexample_and_its_run(tmp_path):
    from killpoint.harness.explore import Exploration, explore
    from killpoint.harness.run import RunConfig, Session

    with Session() as session:
        found = explore(RunConfig(target="mutant:random-request-id", workload="single"), steps=("charge",),
                        points=("after_call", "before_commit"), budget=30, seed=1,
                        database=str(tmp_path / "hypothesis"), session=session)
    assert isinstance(found, Exploration)
    assert found.valid is False and found.minimal is not None, (found.runs, found.unknown)
    assert 1 <= found.runs and found.failures >= 1
    assert found.minimal.result.valid is False and found.minimal.violated
    assert found.minimal.reproduce == found.minimal.result.config.reproduce_command()
    assert found.minimal.reproduce.startswith("killpoint replay ")
    assert len(found.minimal.result.config.schedule.faults) <= 2


# -- loading the plugin is light -----------------------------------------------------------------------
HEAVY = ("killpoint.harness", "killpoint.chaos", "killpoint.reports", "killpoint.scenarios", "multiprocess",
         "psycopg", "psycopg_pool", "jinja2", "faker", "hypothesis")


@pytest.mark.parametrize("statement", ["import killpoint.plugin", "import killpoint",
                                       "from killpoint import KillpointError"])
def test_loading_the_package_or_its_pytest_plugin_imports_nothing_heavy(statement):
    # A fresh interpreter, as pytest's entry point loading sees it: pytest loads killpoint.plugin
    # in every session of an environment that has killpoint installed.
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S,
                          cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == []
    assert "killpoint" in loaded


def test_a_public_name_is_looked_up_on_first_use_and_a_missing_one_is_a_named_error():
    code = ("import sys, killpoint\n"
            "assert 'killpoint.chaos' not in sys.modules\n"
            "s = killpoint.parse_schedule('A@charge.after_call:kill')\n"
            "assert 'killpoint.chaos' in sys.modules and 'killpoint.harness' not in sys.modules\n"
            "print(s)\n"
            "try:\n    killpoint.no_such_name\nexcept AttributeError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S,
                          cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["A@charge.after_call:kill",
                                        "module 'killpoint' has no attribute 'no_such_name'"]


@pytest.mark.parametrize("argv", [["replay", "A@charge.after_call:kill", "-q"],
                                  ["matrix", "--steps", "charge", "--points", "after_call,in_call",
                                   "--jobs", "1", "-q"]])
def test_a_command_running_one_job_at_a_time_never_loads_multiprocess_or_dill(argv):
    # multiprocess (with dill) costs a command about 55 ms to import: only --jobs runners and the
    # library targets' finalizers need it; the downstream's server is forked as the workers are.
    code = ("import json, sys\nfrom killpoint.harness.cli import main\n"
            f"code = main({argv!r})\n"
            "print(json.dumps([code, sorted(m for m in sys.modules if m.split('.')[0] in "
            "('multiprocess', 'dill'))]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S,
                          cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stderr
    code, loaded = json.loads(proc.stdout.splitlines()[-1])
    assert code == 0 and loaded == []
