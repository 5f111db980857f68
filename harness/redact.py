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

Patterns cannot find every password: one holding an unencoded ``#``, ``@``, ``/`` or a space
ends the URL where a pattern would look for it (libpq itself reads ``postgresql://u:p@ss@h/db``
as the password ``p`` on host ``ss@h``). So the DSNs the command was given (``--store``, and the
``KILLPOINT_PG_DSN`` and ``PGPASSWORD`` of its environment) are *registered* (:func:`register`):
parsed as libpq parses them and as their text reads (the user information up to the last ``@``),
their passwords in every form (as typed, percent-decoded, percent-encoded) are replaced wherever
they appear, whatever characters they hold; the patterns stay for the DSNs nobody registered.
"""

from __future__ import annotations

import re
from typing import IO, Any

__all__ = ["HIDDEN", "RedactingStream", "redact", "register"]

HIDDEN = "***"

# The passwords of the registered DSNs, in each form they may be printed in, longest first (a
# password inside another is hidden after it). Only those of 4 characters or more: a shorter one
# would hide every such run of letters in the output (the patterns still hide it in a DSN).
_SECRETS: list[str] = []
_MIN_SECRET = 4

# A URL: a scheme, ``://``, then anything up to whitespace or a quote/bracket that ends it in text.
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s'\"<>`]+")
# A password given as a key: a query parameter or a libpq option (quoted or bare), or PGPASSWORD.
# A bare value ends where a URL parameter, a quoted string (JSON, a shell word) or an HTML tag does.
_KEYED = re.compile(r"(?i)(?<![a-z0-9_])((?:pg|ssl)?password\s*=\s*)"
                    r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s&#'\"<>]+)")


def _url(match: re.Match[str]) -> str:
    url = match.group(0)
    scheme, _, rest = url.partition("://")
    # The userinfo ends at the token's last '@': a password may hold '@', '#', '?' or '/' (hiding
    # too much where a query holds an '@' is the safe side).
    at = rest.rfind("@")
    if at != -1:
        user, colon, _password = rest[:at].partition(":")
        if colon and "/" not in user:
            rest = f"{user}:{HIDDEN}{rest[at:]}"
    return f"{scheme}://{rest}"


def _passwords(dsn: str) -> set[str]:
    """The passwords ``dsn`` may carry: libpq's reading of it, and its text's (the URL's user
    information up to its last ``@``: a password may hold ``@``, ``#``, ``/`` or spaces)."""
    from urllib.parse import unquote

    found: set[str] = set()
    if "://" not in dsn and "password" not in dsn.lower():
        return found  # 'sqlite', or a DSN without a password: nothing to hide (and no psycopg to load)
    scheme, sep, rest = dsn.partition("://")
    if sep and scheme.isascii() and scheme.replace("+", "").replace(".", "").replace("-", "").isalnum():
        userinfo = rest[:rest.rfind("@")] if "@" in rest else ""
        if ":" in userinfo:
            found.add(userinfo.split(":", 1)[1])
    else:  # key=value: the value after password=, quoted or bare
        for m in _KEYED.finditer(dsn):
            value = m.group(2)
            if value[:1] in "'\"":
                value = value[1:-1].replace("\\'", "'").replace('\\"', '"')
            found.add(value)
    try:
        from psycopg import conninfo

        parsed = conninfo.conninfo_to_dict(dsn).get("password")
    except Exception:  # noqa: BLE001 - not a DSN libpq reads (or no psycopg): the text's reading stands
        parsed = None
    if parsed:
        found.add(str(parsed))
    return found | {unquote(p) for p in found}


def register(dsn: str | None, *, password: str | None = None) -> None:
    """Hide, from now on, the password of ``dsn`` (or ``password`` itself, as ``PGPASSWORD``
    gives it) wherever it appears in a text :func:`redact` sees, in every form it may be printed
    in (as typed, percent-decoded and percent-encoded)."""
    from urllib.parse import quote

    found = set(_passwords(dsn)) if dsn else set()
    if password:
        found.add(password)
    for secret in found | {quote(p, safe="") for p in found}:
        if len(secret) >= _MIN_SECRET and secret not in _SECRETS:
            _SECRETS.append(secret)
    _SECRETS.sort(key=len, reverse=True)


def redact(text: str) -> str:
    """``text`` with every password of a connection string or URL replaced by ``***``: the
    registered ones (:func:`register`) wherever they are, the others where a pattern finds them."""
    if not text:
        return text
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, HIDDEN)
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
