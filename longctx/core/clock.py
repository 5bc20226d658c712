"""The one timestamp format of every file longctx writes: UTC, ISO 8601, whole seconds."""

from __future__ import annotations

import time


def utc_timestamp(seconds: float | None = None) -> str:
    """'2026-12-01T08:54:11Z' for `seconds` since the epoch [default: now]."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
