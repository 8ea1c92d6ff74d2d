"""libvgpu against its fake driver: every C test case, normal and under ASan/UBSan, plus the
Python side (usage reader, coordinator) against the real library.

The library is built with its own Makefile (``make -C libvgpu all asan``), under a file
lock so concurrent test runs in one tree do not race. Each C case is one pytest case; a
failure shows the case's own output (file, line, condition, message).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.model.types import ComputePolicy
from tessera.node.burst.coordinator import Coordinator, Tenant
from tessera.node.formats.limits import CardLimit, Limits, encode_limits
from tessera.node.formats.usage import read_region
from tests.integration._libvgpu import GLIBC_BASE, LIBVGPU, VARIANTS, ensure_built


def _cases() -> list[Any]:  # pytest.param objects
    """(program, case) of every C test case, read from the sources' VGT_MAIN tables."""
    out = []
    for src in sorted((LIBVGPU / "tests").glob("*.c")):
        if src.stem.startswith(("host_", "drv_")):
            main = src.read_text().split("VGT_MAIN(", 1)[-1]
            marks = [pytest.mark.slow] if src.stem == "drv_share" else []
            out += [
                pytest.param(src.stem, case, marks=marks, id=f"{src.stem}-{case}")
                for case in re.findall(r"VGT_CASE\((\w+)\)", main)
            ]
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("program", "case"), _cases())
def test_c(variant: str, program: str, case: str) -> None:
    build = ensure_built(variant)
    done = subprocess.run(
        [str(LIBVGPU / "tests" / "run.sh"), str(build), program, case],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (
        f"libvgpu C test {program} {case} ({variant}) failed, exit {done.returncode}:\n"
        f"{done.stdout}{done.stderr}"
    )


# ---- the Python side against the real library ----

FAKE_UUID = "GPU-face0000-0000-0000-0000-0000000000{:02x}"


def _env(build: Path, limits_file: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        LD_LIBRARY_PATH=str(build / "fake"),
        LD_PRELOAD=str(build / "libvgpu-test.so"),
        TESSERA_TEST_LIMITS=str(limits_file),
        **extra,
    )
    return env


def _write_limits(directory: Path, cards: tuple[CardLimit, ...]) -> Limits:
    directory.mkdir(parents=True, exist_ok=True)
    limits = Limits(
        cards=cards, region=str(directory / "region"), allowance=str(directory / "allowance")
    )
    (directory / "limits").write_text(encode_limits(limits))
    return limits


@pytest.fixture
def usage_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    build = ensure_built("normal")
    _write_limits(
        tmp_path,
        (
            CardLimit(0, FAKE_UUID.format(0), 256, 100, ComputePolicy.FIXED_SHARE),
            CardLimit(1, FAKE_UUID.format(1), 512, 50, ComputePolicy.BEST_EFFORT),
        ),
    )
    steps = [
        "alloc",
        "0",
        "100",
        "alloc",
        "0",
        "20",
        "oom",
        "0",
        "200",
        "alloc",
        "1",
        "300",
        "launch",
        "1",
        "7",
    ]
    with subprocess.Popen(
        [str(build / "tests" / "tool_usage"), *steps],
        env=_env(build, tmp_path / "limits"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        yield proc, tmp_path
        proc.kill()


def test_usage_reader_reads_what_libvgpu_wrote(
    usage_process: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, directory = usage_process
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready "), line
    snap = read_region(directory / "region")
    (p,) = snap.processes
    assert p.pid == proc.pid
    assert p.cards[0].memory_bytes == 120 << 20
    assert p.cards[0].refused_allocs == 1
    assert p.cards[1].memory_bytes == 300 << 20
    assert p.cards[1].launches == 7
    assert snap.cards[0].memory_bytes == 120 << 20
    assert snap.cards[1].launches == 7
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    after = read_region(directory / "region")
    assert after.processes == ()
    assert after.cards[1].launches == 7  # retired, not lost
    assert after.cards[0].refused_allocs == 1
    assert after.cards[0].memory_bytes == 0
    assert after.reclaimed_processes == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_a_region_created_by_root_is_usable_by_the_containers_other_users() -> None:
    # nvidia-smi run as root (through the NVML hook) may create the region first; the
    # container's non-root processes must still open it, whatever root's umask was.
    build = ensure_built("normal")
    # Not pytest's tmp_path: its parents are 0700, which another user cannot cross.
    tmp_path = Path(tempfile.mkdtemp(prefix="libvgpu-perm-"))
    tmp_path.chmod(0o777)
    _write_limits(
        tmp_path, (CardLimit(0, FAKE_UUID.format(0), 256, 100, ComputePolicy.FIXED_SHARE),)
    )
    (tmp_path / "limits").chmod(0o444)
    tool = str(build / "tests" / "tool_usage")
    env = _env(build, tmp_path / "limits")

    def as_root() -> None:
        os.umask(0o077)

    def as_nobody() -> None:
        os.setgid(65534)
        os.setuid(65534)

    for preexec, step in ((as_root, ["alloc", "0", "10"]), (as_nobody, ["alloc", "0", "20"])):
        done = subprocess.run(
            [tool, *step],
            env=env,
            input="",
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=preexec,
            check=False,
        )
        assert done.returncode == 0, f"{step}: {done.stdout}{done.stderr}"
        assert done.stdout.startswith("ready "), done.stdout
    assert (tmp_path / "region").stat().st_mode & 0o777 == 0o666
    shutil.rmtree(tmp_path)


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def _fake_card_busy(build: Path) -> Callable[[str], float | None]:
    """The card's utilisation from the fake NVML (which reads the timeline FAKECUDA_SHARED
    names), as the node agent gets it from NVML."""
    nvml = ctypes.CDLL(str(build / "fake" / "libnvidia-ml.so.1"))
    assert nvml.nvmlInit_v2() == 0
    handle = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)) == 0

    def busy(uuid: str) -> float | None:
        u = _Utilization()
        return (
            float(u.gpu)
            if nvml.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(u)) == 0
            else None
        )

    return busy


def _shares(out: str) -> list[tuple[int, float]]:
    rows = []
    for line in out.splitlines():
        at, share = line.split()
        if at != "total":
            rows.append((int(at), float(share)))
    return rows


@pytest.mark.slow
def test_burst_share_borrows_idle_compute_and_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two burst-share tenants on one (fake, shared) card, the coordinator between them.

    A (floor 30) runs alone first and borrows the idle compute; B (floor 50) starts later
    and must get its floor back within a bounded time.
    """
    build = ensure_built("normal")
    uuid = FAKE_UUID.format(0)
    tenants = []
    for name, floor in (("a", 30), ("b", 50)):
        limits = _write_limits(
            tmp_path / name, (CardLimit(0, uuid, 1024, floor, ComputePolicy.BURST_SHARE),)
        )
        tenants.append(Tenant(name, limits, Path(limits.region), Path(limits.allowance)))
    shared = str(tmp_path / "fakegpu")
    monkeypatch.setenv("FAKECUDA_SHARED", shared)
    stop = threading.Event()
    coordinator = Coordinator(lambda: tenants, card_busy=_fake_card_busy(build))
    loop = threading.Thread(target=coordinator.run, args=(stop, 0.1), daemon=True)
    loop.start()
    tool = str(build / "tests" / "tool_loop")
    try:
        # 9 s of A: ~23 samples of 250 ms while both run; one sample swings by +-10
        # points on a loaded CI machine, so fewer made the floor check below flaky.
        run_ms = 9000
        a = subprocess.Popen(
            [tool, "0", "1000000", str(run_ms), "250"],
            env=_env(build, tmp_path / "a" / "limits", FAKECUDA_SHARED=shared),
            stdout=subprocess.PIPE,
            text=True,
        )
        b_start_ms = 2500
        b = subprocess.Popen(
            [tool, "0", "1000000", str(run_ms - b_start_ms), "250", str(b_start_ms)],
            env=_env(build, tmp_path / "b" / "limits", FAKECUDA_SHARED=shared),
            stdout=subprocess.PIPE,
            text=True,
        )
        a_out, _ = a.communicate(timeout=60)
        b_out, _ = b.communicate(timeout=60)
    finally:
        stop.set()
        loop.join(timeout=5)
    assert a.returncode == 0 and b.returncode == 0
    a_rows, b_rows = _shares(a_out), _shares(b_out)
    alone = [s for at, s in a_rows if 1000 <= at <= b_start_ms - 250]
    assert alone and sum(alone) / len(alone) > 75, f"A alone should borrow idle compute: {a_rows}"
    # Bounded give-back: from 750 ms after B starts, A (on average, and already in the
    # first 250 ms sample) stays under 100 - B's floor and B gets its floor; A keeps its
    # own floor too (the coordinator corrects the overlap of the two tenants' measurement
    # windows with the card's utilisation).
    shared_phase = [s for at, s in a_rows if at >= b_start_ms + 750]
    assert shared_phase, a_rows
    a_mean = sum(shared_phase) / len(shared_phase)
    assert a_mean < 53 and shared_phase[0] < 60, f"A did not give B its floor back: {a_rows}"
    b_late = [s for at, s in b_rows if at >= 750]
    assert b_late and sum(b_late) / len(b_late) > 47, f"B did not get its 50% floor: {b_rows}"
    assert a_mean > 27, f"A fell below its own 30% floor under contention: {a_rows}"


def test_the_fake_cards_report_each_process_memory_as_nvml_would(tmp_path: Path) -> None:
    # The node agent's fake discovery reads the files the fake driver shares per card:
    # a live process is listed with its device memory under its pid here; a killed one
    # is not, though its entry stays in the file (the real driver frees it; the fake's
    # readers skip it).
    from tessera.model.clusterspec import make_cards
    from tessera.node.cards.fake import FakeDiscovery

    build = ensure_built("normal")
    cards = make_cards("n", 2, "A100")
    devices = tmp_path / "devices"
    disc = FakeDiscovery(cards, device_dir=devices)
    _write_limits(
        tmp_path / "c",
        (CardLimit(0, cards[1].uuid, 4096, 100, ComputePolicy.FIXED_SHARE),),
    )
    env = _env(
        build,
        tmp_path / "c" / "limits",
        NVIDIA_VISIBLE_DEVICES=cards[1].uuid,
        FAKECUDA_DEVICE_DIR=str(devices),
    )
    tool = str(build / "tests" / "tool_usage")
    with subprocess.Popen(
        [tool, "alloc", "0", "300", "alloc", "0", "50"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready ")
        assert disc.processes(cards[0].uuid) == []
        [p] = disc.processes(cards[1].uuid)
        assert (p.pid, p.memory_bytes) == (proc.pid, 350 << 20)
        proc.kill()
        proc.wait(10)
    time.sleep(0.6)  # past the discovery's pid cache
    assert disc.processes(cards[1].uuid) == []


def _glibc_needs(library: Path) -> list[tuple[int, int]]:
    """The GLIBC_x.y versions ``library``'s dynamic symbols need (objdump, from binutils,
    which the C compiler the build needs brings)."""
    out = subprocess.run(
        ["objdump", "-T", str(library)], capture_output=True, text=True, check=True
    ).stdout
    found = {tuple(int(x) for x in v.split(".")[:2]) for v in re.findall(r"GLIBC_(\d+\.\d+)", out)}
    return sorted(found)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["libvgpu.so", "libvgpu-test.so", "aarch64/libvgpu.so"])
def test_the_library_loads_on_glibc_2_17_or_newer(where: str) -> None:
    # Preloaded through /etc/ld.so.preload, a library that needs a newer glibc than the
    # image has makes every process of the container fail, the shell included.
    build = ensure_built("normal")
    needs = _glibc_needs(build / where)
    assert needs, f"{where}: no GLIBC versions found (not a glibc library?)"
    too_new = [n for n in needs if n > GLIBC_BASE]
    assert not too_new, (
        f"{where} needs GLIBC_{'.'.join(map(str, max(needs)))}, above the baseline "
        f"GLIBC_{'.'.join(map(str, GLIBC_BASE))}: images with an older glibc would refuse it"
    )
