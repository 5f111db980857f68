"""JUnit XML of runs, the format CI systems read: one test case per run.

A violated run is a ``<failure>`` whose message is its first violation and whose text is every
violation and the line that reproduces the run; a run whose verdict is unknown (a fault that never
fired, a checker that failed, an infrastructure fault) is an ``<error>``, never a pass; a valid run
passes. Every string from a run goes through the XML library's escaping, and characters XML 1.0
cannot carry at all (NUL, most control characters) are replaced, so hostile text cannot break the
file.
"""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable, Sequence

from killpoint.harness.redact import redact

if TYPE_CHECKING:
    from killpoint.harness.run import RunResult

# XML 1.0 allows tab, newline, carriage return and everything from U+0020 but the surrogates and
# U+FFFE/U+FFFF.
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def clean(text: object) -> str:
    """Text that XML can carry, with no password in it: every character XML cannot carry is
    replaced by U+FFFD."""
    return _NOT_XML.sub("\ufffd", redact(str(text)))


def build(results: Sequence[RunResult], *, suite: str, reproduce: Callable[[RunResult], str],
          reports: Sequence[str | None] | None = None, tests: Sequence[str | None] | None = None,
          elapsed_s: float | None = None, expect: Sequence[str | None] | None = None) -> ET.ElementTree:
    """The document: a ``<testsuites>`` with one ``<testcase>`` per run.

    ``reproduce(result)`` gives each run's replay line; ``reports[i]`` the path of its HTML report,
    ``tests[i]`` the pytest node id that made it (both optional, written as properties).
    ``expect[i]``, when given and not None, names the invariant run ``i`` must violate (a mutant in
    ``selftest``): the case passes when it is violated, and fails when the mutant got away.

    What the runs' faults exercised (:mod:`killpoint.harness.exercise`) is a property of each case
    and of the suite; when the runs together are unknown for it (no pause exercised a takeover, an
    expectation never reached), one more case, ``exercise``, is an ``<error>`` naming why.
    """
    from killpoint.harness.exercise import matrix_reasons, total

    tally = total(r.exercise for r in results)
    whole = matrix_reasons(tally) if expect is None else ()
    reports = list(reports) if reports is not None else [None] * len(results)
    tests = list(tests) if tests is not None else [None] * len(results)
    expected = list(expect) if expect is not None else [None] * len(results)
    missed = [r for r, e in zip(results, expected) if e is not None and e not in _violated(r)]
    failures = sum(1 for r, e in zip(results, expected) if e is None and r.valid is False) + len(missed)
    errors = sum(1 for r, e in zip(results, expected) if e is None and r.valid is None) + bool(whole)
    total_s = sum(r.duration_s for r in results) if elapsed_s is None else elapsed_s
    counts = {"tests": str(len(results) + bool(whole)), "failures": str(failures), "errors": str(errors),
              "skipped": "0", "time": f"{total_s:.3f}"}
    root, ts = _suites(suite, counts)
    if tally.line():
        ET.SubElement(ET.SubElement(ts, "properties"), "property", {"name": "exercise", "value": clean(tally.line())})
    for n, (r, report, test, must) in enumerate(zip(results, reports, tests, expected), start=1):
        schedule = str(r.config.schedule) or "no faults"
        case = ET.SubElement(ts, "testcase", {
            "classname": clean(f"killpoint.{r.config.target_name}"),
            "name": clean(f"{n:04d} {schedule}"), "time": f"{r.duration_s:.3f}"})
        props = ET.SubElement(case, "properties")
        line = reproduce(r)
        for name, value in (("schedule", str(r.config.schedule)), ("target", r.config.target_name),
                            ("seed", str(r.config.seed)), ("run_id", r.run_id), ("reproduce", line),
                            ("report", report), ("test", test),
                            ("exercise", r.exercise.tally().line() if r.exercise is not None else None)):
            if value is not None:
                ET.SubElement(props, "property", {"name": name, "value": clean(value)})
        if must is not None:
            caught = must in _violated(r)
            if not caught:
                got = ", ".join(_violated(r)) or {True: "valid", None: "unknown"}.get(r.valid, "nothing")
                failure = ET.SubElement(case, "failure", {
                    "message": clean(_clip(f"not caught: {must} must be violated, got {got}")), "type": "missed"})
                failure.text = clean(f"reproduce: {line}")
        elif r.valid is False:
            first = r.verdict.violations[0] if r.verdict.violations else None
            message = (f"{first.invariant} at {first.instance}:{first.step}: {first.detail}" if first
                       else "an invariant was violated")
            body = [f"VIOLATED {v.invariant} at {v.instance}:{v.step}: {v.detail}"
                    for v in r.verdict.violations]
            body.append(f"reproduce: {line}")
            if report:
                body.append(f"report: {report}")
            failure = ET.SubElement(case, "failure", {"message": clean(_clip(message)),
                                                      "type": clean(first.invariant if first else "violated")})
            failure.text = clean("\n".join(body))
        elif r.valid is None:
            reasons = list(r.verdict.unknown_reasons) or ["the verdict is unknown"]
            error = ET.SubElement(case, "error", {"message": clean(_clip(f"unknown: {reasons[0]}")),
                                                  "type": "unknown"})
            error.text = clean("\n".join([*reasons, f"reproduce: {line}"]))
        out = ET.SubElement(case, "system-out")
        out.text = clean(f"reproduce: {line}" + (f"\nreport: {report}" if report else ""))
    if whole:
        case = ET.SubElement(ts, "testcase", {"classname": "killpoint", "name": "exercise", "time": "0.000"})
        error = ET.SubElement(case, "error", {"message": clean(_clip(f"unknown: {whole[0]}")), "type": "not exercised"})
        error.text = clean("\n".join([*whole, f"exercised: {tally.line()}"]))
    ET.indent(root)
    return ET.ElementTree(root)


def write(path: str, results: Sequence[RunResult], *, suite: str, reproduce: Callable[[RunResult], str],
          reports: Sequence[str | None] | None = None, tests: Sequence[str | None] | None = None,
          elapsed_s: float | None = None, expect: Sequence[str | None] | None = None) -> str:
    """Write the JUnit XML of ``results`` to ``path`` atomically; returns ``path``."""
    tree = build(results, suite=suite, reproduce=reproduce, reports=reports, tests=tests,
                 elapsed_s=elapsed_s, expect=expect)
    root = tree.getroot()
    assert root is not None  # build() always makes the <testsuites> element
    return _write(path, root)


def write_broken(path: str, *, suite: str, cause: str) -> str:
    """Write, for a command that the infrastructure ended before any run could be judged (the
    store unreachable), one ``<error>`` case naming the cause: CI that reads the file finds the
    command's failure in it, not a missing file, and never a pass."""
    counts = {"tests": "1", "failures": "0", "errors": "1", "skipped": "0", "time": "0.000"}
    root, ts = _suites(suite, counts)
    case = ET.SubElement(ts, "testcase", {"classname": "killpoint", "name": "infrastructure", "time": "0.000"})
    error = ET.SubElement(case, "error", {"message": clean(_clip(cause)), "type": "infrastructure"})
    error.text = clean(cause)
    return _write(path, root)


def _suites(suite: str, counts: dict[str, str]) -> tuple[ET.Element, ET.Element]:
    """The ``<testsuites>`` element and its one ``<testsuite>``, both carrying ``counts``."""
    root = ET.Element("testsuites", {"name": clean(suite), **counts})
    ts = ET.SubElement(root, "testsuite", {
        "name": clean(suite), **counts, "hostname": clean(socket.gethostname()),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")})
    return root, ts


def _write(path: str, root: ET.Element) -> str:
    """Write the document atomically; returns ``path``."""
    from killpoint.reports.files import write_text

    return write_text(path, "<?xml version='1.0' encoding='utf-8'?>\n" + ET.tostring(root, encoding="unicode"))


def _violated(r: RunResult) -> list[str]:
    return list(dict.fromkeys(v.invariant for v in r.verdict.violations))


def _clip(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


__all__ = ["build", "write", "write_broken", "clean"]
