"""One redaction for all text that leaves the process: a password never shows.

A store is named by a libpq connection string, which can carry its password in several forms:

- in a URL's user information: ``postgresql://user:secret@host/db`` (also ``://:secret@host``);
- as a URL query parameter: ``...?password=secret`` or ``...&password=secret`` (and
  ``sslpassword``);
- as a libpq ``key=value`` option: ``host=h password=secret`` or ``password='se cret'``;
- as the environment variable form ``PGPASSWORD=secret``.

:func:`redact` replaces each such password with ``***`` wherever it sits in a text (a message, a
command line, a JSON document, an HTML page); every other character stays. The CLI passes its
stdout and stderr through it, and the reports pass every file they write through it.
"""

from __future__ import annotations

import re
from typing import IO, Any

__all__ = ["HIDDEN", "RedactingStream", "redact"]

HIDDEN = "***"

# A URL: a scheme, ``://``, then anything up to whitespace or a quote/bracket that ends it in text.
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s'\"<>`]+")
# A password given as a key: a query parameter or a libpq option (quoted or bare), or PGPASSWORD.
# A bare value ends where a URL parameter, a quoted string (JSON, a shell word) or an HTML tag does.
_KEYED = re.compile(r"(?i)(?<![a-z0-9_])((?:pg|ssl)?password\s*=\s*)"
                    r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&#'\"<>]+)")


def _url(match: re.Match[str]) -> str:
    url = match.group(0)
    scheme, _, rest = url.partition("://")
    end = len(rest)
    for stop in "?#":
        i = rest.find(stop)
        if i != -1:
            end = min(end, i)
    head, tail = rest[:end], rest[end:]
    at = head.rfind("@")  # the userinfo ends at the last '@' before the query: a password may hold '@'
    if at != -1:
        user, colon, _password = head[:at].partition(":")
        if colon:
            head = f"{user}:{HIDDEN}{head[at:]}"
    return f"{scheme}://{head}{tail}"


def redact(text: str) -> str:
    """``text`` with every password of a connection string or URL replaced by ``***``."""
    if not text:
        return text
    # Each pattern needs a literal ("://", "password" in any case) that a plain search finds at C
    # speed; without it the pattern cannot match, and a report page (tens of kB) skips the regex
    # scan that cost a 68-page matrix about a second.
    if "://" in text:
        text = _URL.sub(_url, text)
    if "password" in text.lower():
        text = _KEYED.sub(lambda m: m.group(1) + HIDDEN, text)
    return text


class RedactingStream:
    """A text stream that redacts what is written to it before passing it on (for stdout/stderr)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
