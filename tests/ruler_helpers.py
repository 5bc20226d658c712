"""Shared helpers of the ruler_tasks tests."""

from __future__ import annotations

import json
from pathlib import Path

RULER_DATA = Path(__file__).parent / "data" / "ruler"
FIXTURE_DATA = RULER_DATA / "data"


def golden_commands() -> list[dict]:
    """Entries of commands.json: file, task, max_seq_length, random_seed, num_samples, sha256 (upstream's)."""
    return json.loads((RULER_DATA / "commands.json").read_text())
