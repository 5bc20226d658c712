"""What the bench scripts share: argument errors as one line, and how busy the whole machine was while a side ran
(on a shared machine another program's work slows one side more than the other)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def one_line_errors(ap: argparse.ArgumentParser) -> None:
    """`ap.error` prints `<script>: <message> (--help lists the options)` and exits 2, instead of the usage block."""
    def error(message: str) -> None:
        print(f"{Path(sys.argv[0]).stem}: {message} (--help lists the options)", file=sys.stderr)
        sys.exit(2)

    ap.error = error


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy (hypervisor steal included: it slows a run as well)."""
    import psutil  # an accelerate and vLLM dependency

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)
