"""NVIDIA's real CUDA runtimes (the PyPI wheels, 12.x and 13.x) over the fake driver with
libvgpu preloaded: every driver entry they look up reaches libvgpu's hook when libvgpu
hooks it, and the driver's own function otherwise; and the drift check.

A runtime fetches its driver table through ``cuGetProcAddress`` when it initialises
(``cudaGetDeviceCount``): a few hundred names, some again with the per-thread default
stream flag. It goes no further on a fake driver (it checks NVIDIA's private export
tables), which is enough: the table is what an application's CUDA calls go through. The
fake logs each lookup and the symbol it resolved (``FAKECUDA_PROC_LOG``); the child then
repeats each lookup through libvgpu and names the function it got (``dladdr``).

Drift: the entries the runtimes ask for in the families that take device memory, run
work or capture it, minus the hooked ones, minus ``libvgpu/unhooked.tsv``, must be
empty. A CUDA release that adds an allocation entry then fails here instead of leaking.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration._libvgpu import LIBVGPU, ensure_built

RUNTIMES = {
    # wheel, library in it, the driver version the fake reports (the runtime's minimum)
    "12": ("nvidia-cuda-runtime-cu12", "libcudart.so.12", "12090"),
    "13": ("nvidia-cuda-runtime", "libcudart.so.13", "13000"),
}

# The families: names that allocate or free device memory, put work on the GPU, or
# capture it. Queries (Get, Query, Range), copies and sets, graph construction other than
# memory nodes, and graphics interop are outside them (they neither allocate nor run).
FAMILY = re.compile(
    r"^cu(Mem|Array|Mipmapped|Graph|Ipc|ImportExternalMemory|ExternalMemory|CtxCreate"
    r"|GreenCtxCreate|DevicePrimaryCtxRetain|Launch|StreamBeginCapture|StreamEndCapture)"
)
OUTSIDE = re.compile(
    r"Get|Query|Range|^cuMem(cpy|set|Advise|Prefetch|Discard)|^cuGraphics"
    r"|^cuGraph(Add(Child|Dependencies|Empty|Event|External|Host|Kernel|Memcpy|Memset|Node"
    r"|BatchMem|MemFreeNode)|Clone|Create$|Debug|Destroy|Event|Exec|External|Host|Kernel"
    r"|Memcpy|Memset|Node|Release|Retain|Remove|Conditional|MemFreeNode|MemTrim)"
)
SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")

CHILD = r"""
import ctypes, json, sys
runtime, log = sys.argv[1], sys.argv[2]
rt = ctypes.CDLL(runtime)
count = ctypes.c_int(-1)
rc = rt.cudaGetDeviceCount(ctypes.byref(count))
lines = open(log).read().split("\n")

class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

libc = ctypes.CDLL(None)
libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(Info)]
lookup = ctypes.CDLL("libcuda.so.1").cuGetProcAddress_v2  # libvgpu's, through its dlsym
lookup.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                   ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
out = []
for line in filter(None, lines):
    name, ver, flags, resolved = line.rsplit(" ", 3)  # a runtime may ask for ""
    fn, status, info = ctypes.c_void_p(), ctypes.c_int(), Info()
    got = lookup(name.encode(), ctypes.byref(fn), int(ver), int(flags), ctypes.byref(status))
    lib = sym = ""
    if fn.value and libc.dladdr(fn, ctypes.byref(info)):
        lib, sym = info.fname.decode(), (info.sname or b"").decode()
    out.append(dict(name=name, ver=int(ver), flags=int(flags), resolved=resolved, rc=got,
                    lib=lib, symbol=sym))
print(json.dumps(dict(rc=rc, lookups=out)))
"""


def hooked_names() -> set[str]:
    """The driver entries libvgpu intercepts, from the one list in include/vg_cuda.h."""
    text = (LIBVGPU / "include" / "vg_cuda.h").read_text()
    start = text.index("#define VG_CUDA_MEM_FUNCS(X)")
    end = text.index("#define VG_CUDA_USED(X)")
    return set(re.findall(r"X\((cu\w+),", text[start:end]))


def unhooked() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (LIBVGPU / "unhooked.tsv").read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind, reason = line.split("\t")
            assert kind in ("gap", "exempt"), f"unhooked.tsv: {name}: kind {kind!r}"
            rows[name] = (kind, reason)
    return rows


def runtime_library(version: str) -> Path:
    wheel, soname, _ = RUNTIMES[version]
    dist = importlib.metadata.distribution(wheel)
    files = [f for f in dist.files or [] if f.name == soname]
    assert files, f"{wheel} has no {soname}"
    return Path(str(dist.locate_file(files[0])))


_lookups: dict[tuple[str, bool], dict[str, Any]] = {}


def lookups(version: str, tmp: Path, internal: bool = False) -> dict[str, Any]:
    """What runtime ``version`` looked up, and what libvgpu hands out for each lookup;
    ``internal``: the driver hands out internal entry points, not its exported symbols."""
    if (version, internal) not in _lookups:
        build = ensure_built("normal")
        log = tmp / f"lookups-{version}.log"
        limits = tmp / "limits"
        limits.write_text(
            f"version=1\nregion={tmp}/region\nallowance={tmp}/allowance\ncards=1\n"
            "card.0.uuid=GPU-face0000-0000-0000-0000-000000000000\ncard.0.memory_mib=1024\n"
            "card.0.cores_percent=50\ncard.0.policy=fixed-share\n"
        )
        env = dict(
            os.environ,
            LD_LIBRARY_PATH=str(build / "fake"),
            LD_PRELOAD=str(build / "libvgpu-test.so"),
            TESSERA_TEST_LIMITS=str(limits),
            FAKECUDA_PROC_LOG=str(log),
            FAKECUDA_DRIVER_VERSION=RUNTIMES[version][2],
            FAKECUDA_PROC_INTERNAL="1" if internal else "0",
        )
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(runtime_library(version)), str(log)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        _lookups[version, internal] = json.loads(done.stdout)
    return _lookups[version, internal]


@pytest.mark.parametrize("internal", [False, True], ids=["exported", "internal-pointers"])
@pytest.mark.parametrize("version", sorted(RUNTIMES))
def test_every_lookup_of_the_runtime_reaches_its_hook(
    version: str, internal: bool, tmp_path: Path
) -> None:
    got = lookups(version, tmp_path, internal)["lookups"]
    hooked = hooked_names()
    assert len(got) > 300, f"the {version}.x runtime looked up only {len(got)} names"
    wrong = []
    for row in got:
        if row["resolved"] == "-":
            assert row["rc"] != 0, f"{row['name']}: the driver lacks it, libvgpu answered it"
            continue
        want_lib = "libvgpu-test.so" if row["resolved"] in hooked else "libcuda.so.1"
        if not row["lib"].endswith(want_lib) or row["symbol"] != row["resolved"]:
            wrong.append(f"{row['name']} v{row['ver']} flags {row['flags']}: {row}")
    assert not wrong, "\n".join(wrong)
    reached = {(r["resolved"], r["flags"]) for r in got if r["resolved"] in hooked}
    assert ("cuLaunchKernel", 0) in reached and ("cuLaunchKernel_ptsz", 2) in reached
    assert ("cuMemAlloc_v2", 0) in reached
    families = {SUFFIX.sub("", n) for n, _ in reached}
    assert len(families) >= 20, f"only {len(families)} hooked families reached: {families}"


def test_no_allocation_launch_or_capture_entry_is_left_unhooked_unsaid(tmp_path: Path) -> None:
    asked = set()
    for version in RUNTIMES:
        asked |= {r["name"] for r in lookups(version, tmp_path)["lookups"]}
    hooked = {SUFFIX.sub("", n) for n in hooked_names()}
    listed = unhooked()
    family = {n for n in asked if FAMILY.match(n) and not OUTSIDE.search(n)}
    unsaid = sorted(family - hooked - listed.keys())
    assert not unsaid, (
        "the CUDA runtime asks for driver entries that take memory, run work or capture it, "
        f"which libvgpu neither hooks nor lists in libvgpu/unhooked.tsv: {unsaid}"
    )
    stale = sorted(n for n in listed if n in hooked or n not in family)
    assert not stale, f"libvgpu/unhooked.tsv lists hooked or no longer asked for entries: {stale}"
