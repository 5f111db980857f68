"""The example CI workflow (examples/ci/killpoint.yml): it parses, it has what it promises, and its
killpoint commands run here as they would in GitHub Actions -- against a real PostgreSQL server,
writing the JUnit file and the reports that its upload steps name."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from hang import HANG_S

yaml = pytest.importorskip("yaml")

WORKFLOW = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "ci", "killpoint.yml")


def _workflow() -> dict[str, Any]:
    with open(WORKFLOW, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _job() -> dict[str, Any]:
    (job,) = _workflow()["jobs"].values()
    return job


def _killpoint_steps() -> list[dict[str, Any]]:
    return [s for s in _job()["steps"] if str(s.get("run", "")).lstrip().startswith("killpoint ")]


def test_workflow_parses_with_postgres_as_a_service_and_uploads_junit_and_reports_always():
    data = _workflow()
    assert data.get("on", data.get(True))  # PyYAML reads the key `on` as True (YAML 1.1)
    job = _job()
    pg = job["services"]["postgres"]
    assert pg["image"].startswith("postgres:") and "5432:5432" in pg["ports"]
    assert "pg_isready" in pg["options"]
    uploads = {s["with"]["path"].rstrip("/"): s for s in job["steps"]
               if str(s.get("uses", "")).startswith("actions/upload-artifact@")}
    assert all(s.get("if") == "always()" for s in uploads.values())  # a red run still uploads
    commands = " ".join(s["run"] for s in _killpoint_steps())
    assert "--junit-xml killpoint-results/" in commands and "killpoint-results" in uploads
    assert "--report-dir killpoint-report" in commands and "killpoint-report" in uploads
    assert "$KILLPOINT_STORE" in commands and job["env"]["KILLPOINT_STORE"].startswith("postgresql://")
    assert "--database killpoint-examples" in commands and "killpoint-examples" in uploads  # they travel


def test_workflow_killpoint_commands_run_here_and_write_what_the_uploads_collect(tmp_path, pg_dsn):
    """Each killpoint step, run by bash as Actions would, with the store pointed at our server."""
    env = {**os.environ, **{k: str(v) for k, v in _job()["env"].items()}, "KILLPOINT_STORE": pg_dsn,
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    steps = _killpoint_steps()
    assert [s["run"].split()[1] for s in steps] == ["--version", "matrix", "replay", "explore"]
    for step in steps:
        proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=HANG_S)
        assert proc.returncode == 0, (step["name"], shlex.quote(step["run"]), proc.stdout[-2000:],
                                      proc.stderr[-2000:])
        assert "\x1b[" in proc.stdout + proc.stderr or step["run"].split()[1] == "--version"  # FORCE_COLOR
    matrix = ET.parse(tmp_path / "killpoint-results" / "matrix.xml").getroot()
    cases = list(matrix.iter("testcase"))
    assert len(cases) == 12 and not list(matrix.iter("failure")) and not list(matrix.iter("error"))
    assert len(list(ET.parse(tmp_path / "killpoint-results" / "replay.xml").getroot().iter("testcase"))) == 1
    explored = ET.parse(tmp_path / "killpoint-results" / "explore.xml").getroot()
    assert len(list(explored.iter("testcase"))) >= 20 and not list(explored.iter("failure"))
    assert (tmp_path / "killpoint-report" / "index.html").is_file()
    assert len(list((tmp_path / "killpoint-report").glob("run*.html"))) == len(cases)  # named after run ids
