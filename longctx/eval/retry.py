"""How the openai backend waits before it tries a request again: the server's `Retry-After` (RFC 9110 §10.2.3),
bounded."""

from __future__ import annotations

import email.utils
from datetime import datetime, timezone

# The longest `Retry-After` honoured: a server (or a proxy in front of it) asking for more would stall the run
# with no sign of life; past this the request is retried anyway, and fails like any other when it is refused.
MAX_RETRY_AFTER_S = 300.0
# A wait before retrying a completion at least this long is said (one line), not slept through silently.
LONG_WAIT_S = 10.0


def retry_after(value: str | None, now: datetime | None = None, cap: float = MAX_RETRY_AFTER_S) -> float | None:
    """The seconds a `Retry-After` header asks to wait (RFC 9110 §10.2.3: delay-seconds or an HTTP-date),
    at most `cap`; None when there is no header or it says neither."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # delay-seconds is ASCII digits ("²".isdigit() is True too)
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # an HTTP-date is always GMT; "-0000" parses to a naive datetime
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return min(max(seconds, 0.0), cap)

