"""The machine a benchmark ran on, for its table's title (docs/benchmarks.md keeps it)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> str:
    """CPU model, core count, Python version and the load average at the call."""
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}{load}"
