"""Building libvgpu for the integration tests: once per session, under a file lock."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIBVGPU = REPO / "libvgpu"
VARIANTS = {"normal": LIBVGPU / "build", "asan": LIBVGPU / "build" / "asan"}
# What `make libvgpu` passes: the shipped library is built with zig cc (ziglang, a dev
# dependency) against GLIBC_BASE.
ZIG = f"{sys.executable} -m ziglang"
GLIBC_BASE = (2, 17)
_built: set[str] = set()


def ensure_built(variant: str) -> Path:
    """Build libvgpu (``all`` or ``asan``) once per session; the build directory."""
    if variant not in _built:
        (LIBVGPU / "build").mkdir(exist_ok=True)
        with open(LIBVGPU / "build" / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            target = "all" if variant == "normal" else "asan"
            done = subprocess.run(
                ["make", "-C", str(LIBVGPU), "-j2", target, f"ZIG={ZIG}"],
                capture_output=True,
                text=True,
                check=False,
            )
        assert done.returncode == 0, (
            f"make -C libvgpu {target} failed:\n{done.stdout}\n{done.stderr}"
        )
        _built.add(variant)
    return VARIANTS[variant]
