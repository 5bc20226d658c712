"""What of a value may be recorded or printed: a URL without the secrets it may carry.

A URL given to longctx (`--base-url`) may hold a credential in its user info (`http://user:pw@host`) or in
its query (`?api_key=...`, a signed `?sig=...`); a query parameter's name does not say whether its value is
one, so every query value is masked. What is recorded (run.json, scores.json, results.json, stage markers,
provenance) and printed (messages, logs) is the redacted form.
"""

from __future__ import annotations

import urllib.parse

REDACTED = "***"


def redact_url(url: str, *, userinfo: bool = True) -> str:
    """`url` as it may be recorded or printed: scheme, host, port and path as given; the user info (name and
    password) replaced by `***` (left out with `userinfo=False`), every query value and the fragment by `***`
    (`http://***@host:8000/v1?api_key=***`). A URL that does not parse is `***` whole."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return REDACTED
    _, at, host = parts.netloc.rpartition("@")
    netloc = (f"{REDACTED}@" if at and userinfo else "") + host
    query = "&".join(f"{name}={REDACTED}" if sep else (REDACTED if name else "")
                     for name, sep, _ in (p.partition("=") for p in parts.query.split("&"))) if parts.query else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, REDACTED if parts.fragment else ""))
