"""A user's project that has its own top-level packages named ``chaos``, ``harness``, ``reports``
and ``scenarios`` -- as a Django project has its ``reports`` app -- runs killpoint's pytest plugin,
with HTML reports written, and its own imports get its own packages: killpoint installs nothing at
top level but ``killpoint``. Checked on this (editable) installation and on a wheel installed into a
fresh virtual environment, where ``import harness`` must fail and ``import killpoint.harness`` work.

The wheel's environment gets killpoint only from the wheel; its dependencies (pytest, psycopg, ...)
come from this environment's site-packages through a path file, which adds the folder without
running its path files (so this environment's editable finder for killpoint is not installed there).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

from hang import HANG_S

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("chaos", "harness", "reports", "scenarios")

USER_TEST = '''
import os

import chaos
import harness
import reports
import scenarios


def test_the_projects_own_packages_are_its_own():
    for module in (chaos, harness, reports, scenarios):
        assert module.OWNER == "the user's project", module
        assert os.path.dirname(os.path.dirname(module.__file__)) == os.getcwd(), module.__file__


def test_killpoint_runs_a_crash_next_to_them(killpoint):
    import killpoint as kp

    expected = os.environ.get("EXPECT_KILLPOINT_UNDER")
    if expected:
        assert kp.__file__.startswith(expected), kp.__file__
    killpoint.run("A@charge.after_call:kill", workload="single").assert_valid()
    # The user's packages are still theirs after the harness was imported.
    assert reports.OWNER == harness.OWNER == "the user's project"
'''


def make_project(path: Path) -> Path:
    for name in NAMES:
        (path / name).mkdir(parents=True)
        (path / name / "__init__.py").write_text(f'OWNER = "the user\'s project"\nNAME = "{name}"\n')
    (path / "test_user.py").write_text(USER_TEST)
    (path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return path


def run_user_suite(python: str, project: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    report_dir = project / "kp-reports"
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:xdist", "--killpoint-report-dir",
                           str(report_dir), "test_user.py"],
                          cwd=project, capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout
    pages = sorted(p.name for p in report_dir.iterdir())
    assert "index.html" in pages and any(p.startswith("run-") for p in pages), pages
    return proc


def test_a_user_project_with_its_own_chaos_harness_reports_scenarios_runs_the_plugin(tmp_path):
    project = make_project(tmp_path / "project")
    run_user_suite(sys.executable, project)


def _dev_site_packages() -> list[str]:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    return sorted(p for p in paths if os.path.isdir(p))


def test_a_wheel_install_has_only_killpoint_at_top_level_and_runs_a_user_project(tmp_path):
    # Build the wheel from a copy of the sources, so the build leaves nothing in the repository.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info",
                                                             "__pycache__", ".killpoint", ".hypothesis",
                                                             "killpoint-report", "node_modules"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "-w", str(wheels), str(src)], check=True, capture_output=True, text=True, timeout=HANG_S)
    (wheel,) = wheels.glob("killpoint-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=HANG_S)
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", purelib, str(wheel)], check=True, capture_output=True, text=True, timeout=HANG_S)
    Path(purelib, "killpoint_test_dependencies.pth").write_text("\n".join(_dev_site_packages()) + "\n")

    installed = sorted(p.name for p in Path(purelib).iterdir())
    assert "killpoint" in installed and not set(NAMES) & set(installed), installed
    empty = tmp_path / "empty"
    empty.mkdir()
    probe = subprocess.run([python, "-c", "import json, killpoint.harness.run, killpoint.reports; "
                            "print(json.dumps(killpoint.harness.run.__file__))"],
                           cwd=empty, capture_output=True, text=True, timeout=HANG_S)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout).startswith(purelib)  # from the wheel, not from this checkout
    for name in NAMES:
        gone = subprocess.run([python, "-c", f"import {name}"], cwd=empty, capture_output=True, text=True,
                              timeout=HANG_S)
        assert gone.returncode != 0 and f"No module named '{name}'" in gone.stderr, (name, gone.stderr)

    project = make_project(tmp_path / "project")
    run_user_suite(python, project, env={"EXPECT_KILLPOINT_UNDER": purelib})
