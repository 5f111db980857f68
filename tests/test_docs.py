"""The first hour of a new user: the README's promises and the docs site's pages.

The README's quick start and its five-minute worker are what a newcomer types first: the worker in
the README is the example file, and that file is valid on its whole matrix while the README's "break
it" edit is caught. Every README link into the docs resolves; every word the output prints is in the
glossary. (`.ci/run` builds the site with `mkdocs build --strict`, which fails on a broken link.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from hang import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "examples", "quickstart")


def _read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return fh.read()


def _matrix(folder: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "killpoint.harness.cli", "matrix", "--target", "my_worker:worker",
                           "--json", "--quiet"], cwd=folder, capture_output=True, text=True,
                          timeout=HANG_S, env={**os.environ, "PYTHONPATH": ROOT})
    return done.returncode, json.loads(done.stdout)


def test_the_readme_is_short_and_keeps_the_two_quick_start_commands():
    readme = _read("README.md")
    assert len(readme.splitlines()) <= 300
    assert "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/killpoint demo\n" in readme
    assert ".venv/bin/python -m pytest -q -n 2\n" in readme
    # CI runs the README's test command, as it is written there
    assert "\npython -m pytest -q -n 2\n" in _read(".ci", "run")


def test_the_readme_worker_is_the_example_file_whole():
    """Protects the five-minute worker from drifting from the file the tests run (no '...' in it)."""
    readme = _read("README.md")
    block = readme.split("## Test your own worker in five minutes", 1)[1]
    (code,) = re.findall(r"```python\n(.*?)```", block, re.S)[:1]
    example = _read("examples", "quickstart", "my_worker.py")
    body = example.split('"""', 2)[2].lstrip("\n")  # the file less its docstring
    assert code == body and "..." not in code


def test_the_five_minute_worker_is_valid_and_its_broken_version_is_caught(tmp_path):
    """The README's claim, run: the worker's matrix is valid with every scheduled fault fired, and
    the edit the README suggests (a new key per attempt) exits 1 on no_duplicate_effects."""
    code, report = _matrix(QUICKSTART)
    assert code == 0 and report["valid"] is True and f"{report['runs']} runs, " in _read("README.md")
    assert all(r["unfired"] == [] for r in report["results"])
    source = _read("examples", "quickstart", "my_worker.py")
    edit = "key = step.key(instance)"
    assert edit in source and "key = step.key(instance)" in _read("README.md")
    broken = source.replace(edit, "key = str(uuid.uuid4())")
    broken = broken.replace("import killpoint\n", "import uuid\n\nimport killpoint\n", 1)
    (tmp_path / "my_worker.py").write_text(broken)
    code, report = _matrix(str(tmp_path))
    assert code == 1 and {v["invariant"] for v in report["violations"]} == {"no_duplicate_effects"}


def test_every_readme_link_into_the_docs_names_a_page_that_exists():
    readme = _read("README.md")
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) > 10
    missing = [link for link in links if not os.path.isfile(os.path.join(ROOT, link))]
    assert not missing


def test_every_page_the_site_navigates_exists():
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as fh:
        config = yaml.safe_load(fh)

    def pages(nav):
        for entry in nav:
            for value in (entry.values() if isinstance(entry, dict) else [entry]):
                yield from (pages(value) if isinstance(value, list) else [value])

    found = list(pages(config["nav"]))
    assert "reference/glossary.md" in found and "reference/target-contract.md" in found
    assert [p for p in found if not os.path.isfile(os.path.join(ROOT, "docs", p))] == []


@pytest.mark.parametrize("term", [
    "`valid`", "`VIOLATED`", "`unknown`", "`n/a`", "not applicable", "judged", "scheduled faults fired",
    "starved", "`every verdict the same`", "`VERDICTS DIFFER`", "timing-dependent", "`running -> running`",
    "`REFUSED`", "recovery evidence", "quiescent", "late grace over", "replacements stopped",
    "dangerous window", "indeterminate", "mutation score", "virtual clock", "reproduce",
])
def test_the_glossary_defines_every_term_the_output_prints(term):
    assert term in _read("docs", "reference", "glossary.md")


def test_the_glossary_names_each_verdict_word_the_commands_print():
    from killpoint import vocab

    glossary = _read("docs", "reference", "glossary.md")
    assert all(f"`{word}`" in glossary for word in vocab.VERDICT_WORDS.values())


def test_the_target_contract_lists_every_store_event_kind():
    """Protects the reference a user writes a history() hook from: every kind the hook may give."""
    from killpoint import vocab

    contract = _read("docs", "reference", "target-contract.md")
    assert all(f"| `{kind}` |" in contract for kind in vocab.STORE_KINDS)
    fields = contract.split("### Fields", 1)[1].split("###", 1)[0]
    for field in ("fence", "lease_version", "state_version", "from_state", "to_state", "attempt", "t", "worker"):
        assert re.search(rf"^\| [^|]*`{field}`", fields, re.M), field
