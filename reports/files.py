"""Writing a report's files: whole, atomically, with no password in them (no Jinja2 needed)."""

from __future__ import annotations

import os
import tempfile

from killpoint.harness.redact import redact


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
