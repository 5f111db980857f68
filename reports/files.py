"""Writing a report's files: whole, atomically, with no password in them (no Jinja2 needed)."""

from __future__ import annotations

import os
import re
import tempfile

from killpoint.errors import BadInput, shown
from killpoint.harness.redact import redact

REPORT_MARKER = ".killpoint-report"  # in a report directory: its pages are killpoint's to replace
# The pages killpoint writes into a report directory: the index, a command's run pages (named after
# their runs, run0023-s0-1a2b3c4d.html, or by position, run-0023.html), and a pytest session's (named
# after the xdist worker that wrote them under pytest-xdist: gw0-run-0001.html).
OWN_PAGE = re.compile(r"^(index|(gw\d+-)?run-\d{4,}(-\d+)?|run\d{4,}-s-?\d+-[0-9a-f]{8}(-\d+)?)\.html$")


def write_text(path: str, text: str) -> str:
    """Write a whole file atomically, so a reader never opens half a report; no password in it
    (reports travel as CI artefacts: every file goes through :func:`killpoint.harness.redact.redact`)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".report-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(redact(text))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def check_report_path(where: str, flag: str = "--report-dir") -> None:
    """:func:`check_report_dir` for a path (``flag``: how the user gave it, for the message)."""
    if os.path.exists(where) and not os.path.isdir(where):
        raise BadInput(f"{flag} {shown(where)} is a file: name a directory to write into")
    existing = os.path.abspath(where)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    why = None
    if not os.path.isdir(existing):
        why = "Not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = "Permission denied"
    elif existing == os.path.abspath(where):
        try:
            names = os.listdir(where)
        except OSError as exc:
            why = exc.strerror or str(exc)
        else:
            if "index.html" in names and REPORT_MARKER not in names:
                raise BadInput(f"{flag} {shown(where)} holds an index.html that killpoint did not "
                               f"write: name an empty directory, or one killpoint writes to")
    if why is not None:
        raise BadInput(f"{flag} {shown(where)}: cannot write reports there ({why})")


def check_file_path(path: str, flag: str) -> None:
    """Before the first run: refuse a file path (``--junit-xml``) that no file can be written to --
    a directory, a path under a regular file, a parent folder that cannot be made or written (a
    file is made there and removed at once) -- so that a typo is exit 2 before any run, not an
    error after every run has been made that hides their verdict. Missing parent folders are fine:
    writing the file makes them."""
    if os.path.isdir(path):
        raise BadInput(f"{flag} {shown(path)} is a directory: name a file to write")
    existing = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    why = None
    if not os.path.isdir(existing):
        why = "Not a directory"  # a regular file where one of its folders would go
    else:
        try:  # what writing will do there (os.access says yes to root on a read-only file system)
            fd, probe = tempfile.mkstemp(dir=existing, prefix=".killpoint-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            why = exc.strerror or str(exc)
    if why is not None:
        raise BadInput(f"{flag} {shown(path)}: cannot write it there ({why})")


def claim_report_dir(where: str) -> None:
    """Make ``where`` and mark it as killpoint's, so that a later command or session may replace
    its pages (and is not refused as if its index.html were a user's own). Raises OSError."""
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, REPORT_MARKER), "w", encoding="utf-8") as fh:
        fh.write("killpoint replaces the index.html, run pages, killpoint.css and killpoint.js of this directory\n")


def clear_earlier_pages(where: str, keep: "set[str] | frozenset[str]" = frozenset()) -> None:
    """Remove the pages (:data:`OWN_PAGE`) an earlier command or session left in ``where``, all but
    the file names in ``keep``; only in a directory killpoint marked as its own. Raises OSError."""
    names = os.listdir(where) if os.path.isdir(where) else []
    if REPORT_MARKER not in names:
        return
    for name in names:
        if OWN_PAGE.match(name) and name not in keep:
            try:
                os.unlink(os.path.join(where, name))
            except FileNotFoundError:
                pass
