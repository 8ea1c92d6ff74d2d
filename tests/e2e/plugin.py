"""``kubectl tessera`` as a user runs it: the installed ``kubectl-tessera`` executable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["PLUGIN", "rows", "run"]

PLUGIN = Path(sys.executable).parent / "kubectl-tessera"


def run(kubeconfig: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """The plugin's answer; with ``ok``, fails the test unless it exits 0."""
    assert PLUGIN.exists(), f"{PLUGIN} is not installed (make setup installs it)"
    env = {**os.environ, "COLUMNS": "250"}
    r = subprocess.run([str(PLUGIN), *args, "--kubeconfig", str(kubeconfig)], env=env,
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if ok:
        assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def rows(text: str) -> list[dict[str, str]]:
    """kubectl-style columns into dicts (headers are single words; cells are separated by
    three spaces or more, so a cell may hold single spaces)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    headers = lines[0].split()
    out = []
    for ln in lines[1:]:
        if "   " not in ln:
            continue  # a message line, not a row
        cells = [c.strip() for c in ln.split("   ") if c.strip()]
        out.append(dict(zip(headers, cells, strict=False)))
    return out
