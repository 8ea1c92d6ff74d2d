"""libvgpu measured on a real GPU; driven by bench/gpu/run.sh (see there for the list).

    python3 bench/gpu/gpu_bench.py --out DIR --launch-bench PATH PART   (PART: all, cap, ...)

Every measurement runs in a child process with libvgpu preloaded and a limits file written
here (the test build reads TESSERA_TEST_LIMITS; the production build reads only
/etc/tessera/limits). Results: DIR/results.md (a table per part) and DIR/results.json.
Only the standard library is needed; PyTorch and CuPy parts are skipped where absent.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "libvgpu" / "build"
MIB = 1 << 20
SPIN_PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry spin(.param .u64 cycles) {
  .reg .u64 %rd<5>;
  .reg .pred %p;
  ld.param.u64 %rd1, [cycles];
  mov.u64 %rd2, %clock64;
LOOP:
  mov.u64 %rd3, %clock64;
  sub.u64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p, %rd4, %rd1;
  @%p bra LOOP;
  ret;
}
"""


# ---- helpers used by the parent ----


def gpu_uuid() -> str:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def write_limits(directory: Path, uuid: str, mib: int, cores: int, policy: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "limits"
    path.write_text(
        f"version=1\nregion={directory}/region\nallowance={directory}/allowance\ncards=1\n"
        f"card.0.uuid={uuid}\ncard.0.memory_mib={mib}\ncard.0.cores_percent={cores}\n"
        f"card.0.policy={policy}\n"
    )
    return path


def child(args: list[str], limits: Path | None, extra_env: dict[str, str] | None = None) -> dict:
    """Run ``gpu_bench.py child ...`` (or a command) and parse its last stdout line as JSON."""
    env = dict(os.environ, **(extra_env or {}))
    if limits is not None:
        env.update(LD_PRELOAD=str(BUILD / "libvgpu-test.so"), TESSERA_TEST_LIMITS=str(limits))
    cmd = args if args[0] != "child" else [sys.executable, __file__, *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"exit {done.returncode}: {done.stderr[-2000:]}"}


# ---- children (run with libvgpu preloaded) ----


class Driver:
    """The CUDA driver through ctypes (libvgpu intercepts through its dlsym)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.dev = dev.value
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self.dev), "ctx")
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    @staticmethod
    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned {rc}")

    def alloc(self, nbytes: int) -> tuple[int, int]:
        p = ctypes.c_uint64()
        rc = self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes))
        return rc, p.value

    def free(self, p: int) -> None:
        self.check(self.lib.cuMemFree_v2(ctypes.c_uint64(p)), "cuMemFree_v2")

    def mem_info(self) -> tuple[int, int]:
        f, t = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(self.lib.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t)), "cuMemGetInfo_v2")
        return f.value, t.value


def child_cap(cap_mib: int) -> dict:
    d = Driver()
    out: dict = {"cap_mib": cap_mib}
    out["mem_get_info_before"] = d.mem_info()
    total = ctypes.c_size_t()
    d.check(d.lib.cuDeviceTotalMem_v2(ctypes.byref(total), d.dev), "cuDeviceTotalMem_v2")
    out["device_total_mem"] = total.value
    rc_ok, p = d.alloc((cap_mib - 1) * MIB)
    rc_over, q = d.alloc(2 * MIB)
    rc_last, r = d.alloc(1 * MIB)
    out.update(cap_minus_1mib=rc_ok, then_2mib=rc_over, then_1mib=rc_last)
    out["mem_get_info_full"] = d.mem_info()
    for x, rc in ((p, rc_ok), (q, rc_over), (r, rc_last)):
        if rc == 0:
            d.free(x)
    rc_over_cap, _ = d.alloc((cap_mib + 1) * MIB)
    out["cap_plus_1mib"] = rc_over_cap
    # The CUDA 12 runtime's way in: cuGetProcAddress.
    fn = ctypes.c_void_p()
    gpa = d.lib.cuGetProcAddress
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64]
    d.check(gpa(b"cuMemAlloc", ctypes.byref(fn), 12000, 0), "cuGetProcAddress")
    alloc_t = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
    ptr = ctypes.c_uint64()
    out["get_proc_address_over_cap"] = alloc_t(fn.value)(ctypes.byref(ptr), (cap_mib + 1) * MIB)
    out["pass"] = (
        rc_ok == 0
        and rc_over == 2
        and rc_last == 0
        and rc_over_cap == 2
        and out["get_proc_address_over_cap"] == 2
        and total.value == cap_mib * MIB
    )
    return out


def child_torch_fill(cap_mib: int) -> dict:
    import torch

    free, total = torch.cuda.mem_get_info()
    held, chunk = [], 64 * MIB
    try:
        while True:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass
    small = 1 * MIB
    try:
        while True:
            held.append(torch.empty(small, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        pass
    tensors = sum(t.numel() for t in held)
    return {
        "cap_mib": cap_mib,
        "mem_get_info": [free, total],
        "tensor_mib_at_oom": tensors / MIB,
        "reserved_mib_at_oom": torch.cuda.memory_reserved() / MIB,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "pass": total == cap_mib * MIB and torch.cuda.memory_reserved() <= cap_mib * MIB,
    }


def child_cupy_fill(cap_mib: int) -> dict:
    import cupy

    cupy.cuda.set_allocator(None)  # no pool: every array is one driver allocation
    free, total = cupy.cuda.runtime.memGetInfo()
    held, n = [], 0
    for size in (64 * MIB, MIB):
        try:
            while True:
                held.append(cupy.empty(size, dtype=cupy.uint8))
                n += size
        except cupy.cuda.memory.OutOfMemoryError:
            pass
    return {
        "cap_mib": cap_mib,
        "mem_get_info": [free, total],
        "allocated_mib_at_oom": n / MIB,
        "pass": total == cap_mib * MIB and n <= cap_mib * MIB,
    }


def child_spin(seconds: float, cycles: int, streams: int = 0) -> dict:
    """Spin kernels for ``seconds``: on the legacy stream, or alternating between
    ``streams`` non-blocking streams (NCCL and side-stream work)."""
    d = Driver()
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    d.check(d.lib.cuModuleLoadData(ctypes.byref(mod), SPIN_PTX + b"\0"), "cuModuleLoadData")
    d.check(d.lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin"), "cuModuleGetFunction")
    arg = ctypes.c_uint64(cycles)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(arg), ctypes.c_void_p))
    handles = []
    for _ in range(streams):
        s = ctypes.c_void_p()
        d.check(d.lib.cuStreamCreate(ctypes.byref(s), 1), "cuStreamCreate")  # NON_BLOCKING
        handles.append(s)
    launch = d.lib.cuLaunchKernel
    n, end = 0, time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < end:
        s = handles[n % len(handles)] if handles else None
        d.check(launch(fn, 1, 1, 1, 1, 1, 1, 0, s, params, None), "cuLaunchKernel")
        n += 1
    d.check(d.lib.cuCtxSynchronize(), "cuCtxSynchronize")
    return {"kernels_per_s": n / (time.monotonic() - start)}


def child_torch_graph(seconds: float) -> dict:
    """torch.cuda.graph: capture a few matmuls on a side stream, then replay for
    ``seconds``. Under libvgpu the capture must succeed and replays be throttled."""
    import torch

    a = torch.randn(2048, 2048, device="cuda")
    b = torch.randn(2048, 2048, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            (a @ b).relu_()  # warm-up outside the capture, as the docs ask
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c = a
        for _ in range(8):
            c = (c @ b).relu_() / 2048.0
    torch.cuda.synchronize()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        g.replay()
        n += 1
    torch.cuda.synchronize()
    return {"captured": True, "replays_per_s": n / (time.perf_counter() - start)}


def child_context(hold_s: float) -> dict:
    """Create the primary context and hold it, for the parent to read what the driver
    counts for it (nvidia-smi's per-process memory): the figure for --context-mib."""
    d = Driver()
    free, total = d.mem_info()
    print(json.dumps({"pid": os.getpid(), "ready": True}), flush=True)
    time.sleep(hold_s)
    return {"free": free, "total": total}


def child_torch_step(steps: int) -> dict:
    import torch

    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 1024, device="cuda")
    for _ in range(20):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    torch.cuda.synchronize()
    return {"ms_per_step": (time.perf_counter() - t0) * 1000 / steps}


# ---- parts (parent) ----


def part_cap(tmp: Path, uuid: str) -> dict:
    return child(
        ["child", "cap", "1024"], write_limits(tmp / "cap", uuid, 1024, 100, "fixed-share")
    )


def part_frameworks(tmp: Path, uuid: str) -> dict:
    lim = write_limits(tmp / "fw", uuid, 2048, 100, "fixed-share")
    return {
        "torch": child(["child", "torch_fill", "2048"], lim),
        "torch_expandable_segments": child(
            ["child", "torch_fill", "2048"],
            lim,
            {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        ),
        "torch_malloc_async": child(
            ["child", "torch_fill", "2048"],
            lim,
            {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
        ),
        "cupy": child(["child", "cupy_fill", "2048"], lim),
    }


def part_share(tmp: Path, uuid: str) -> dict:
    cycles = str(1_000_000)  # about 0.5-1 ms per kernel
    out: dict = {}
    for streams in ("0", "2"):  # the legacy stream; two non-blocking streams
        base = child(["child", "spin", "5", cycles, streams], None).get("kernels_per_s", 0.0)
        row: dict = {"unlimited_kernels_per_s": base, "targets": {}}
        for target in (10, 30, 50, 70, 90):
            lim = write_limits(tmp / f"share{target}-{streams}", uuid, 4096, target, "fixed-share")
            got = child(["child", "spin", "8", cycles, streams], lim).get("kernels_per_s", 0.0)
            row["targets"][target] = 100.0 * got / base if base else None
        out["legacy stream" if streams == "0" else "two non-blocking streams"] = row
    return out


def part_graphs(tmp: Path, uuid: str) -> dict:
    """torch.cuda.graph capture and replay under fixed-share 50, against unlimited."""
    base = child(["child", "torch_graph", "5"], None)
    lim = write_limits(tmp / "graph50", uuid, 8192, 50, "fixed-share")
    held = child(["child", "torch_graph", "8"], lim)
    ratio = None
    if base.get("replays_per_s") and held.get("replays_per_s"):
        ratio = 100.0 * held["replays_per_s"] / base["replays_per_s"]
    return {"unlimited": base, "fixed_share_50": held, "achieved_percent": ratio}


def part_context(tmp: Path, uuid: str) -> dict:
    """What one CUDA context costs on this GPU and driver (the value for --context-mib):
    nvidia-smi's memory for a process that holds only a primary context."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "child", "context", "5"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline() or "{}")
    time.sleep(1.0)
    q = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    rows = subprocess.run(q, capture_output=True, text=True, check=False).stdout
    proc.wait(timeout=30)
    mine = [r for r in rows.splitlines() if r.split(",")[0].strip() == str(first.get("pid"))]
    return {"context_mib": int(mine[0].split(",")[1]) if mine else None, "nvidia_smi": rows}


def part_overhead(tmp: Path, uuid: str, launch_bench: str) -> dict:
    out: dict = {}
    configs = {
        "native": None,
        "best-effort": write_limits(tmp / "ob", uuid, 65536, 0, "best-effort"),
        "fixed-share 100": write_limits(tmp / "of", uuid, 65536, 100, "fixed-share"),
        "fixed-share 50": write_limits(tmp / "of50", uuid, 65536, 50, "fixed-share"),
    }
    for name, lim in configs.items():
        runs = []
        for _ in range(5):
            env = dict(os.environ)
            if lim is not None:
                env.update(LD_PRELOAD=str(BUILD / "libvgpu-test.so"), TESSERA_TEST_LIMITS=str(lim))
            done = subprocess.run(
                [launch_bench, "200000"], env=env, capture_output=True, text=True, check=False
            )
            if done.returncode == 0:
                runs.append(float(done.stdout.strip()))
        best = min(runs) if runs else None
        step = child(["child", "torch_step", "200"], lim)
        out[name] = {
            "ns_per_launch": best,
            "torch_ms_per_step": step.get("ms_per_step"),
            "torch": step,
        }
    return out


def part_smi(tmp: Path, uuid: str) -> dict:
    lim = write_limits(tmp / "smi", uuid, 3000, 100, "fixed-share")
    env = dict(os.environ, LD_PRELOAD=str(BUILD / "libvgpu-test.so"), TESSERA_TEST_LIMITS=str(lim))
    q = [
        "nvidia-smi",
        "--query-gpu=memory.total,memory.used,memory.free",
        "--format=csv,noheader,nounits",
        "-i",
        "0",
    ]
    native = subprocess.run(q, capture_output=True, text=True, check=False).stdout.strip()
    inside = subprocess.run(q, env=env, capture_output=True, text=True, check=False).stdout.strip()
    return {
        "native": native,
        "preloaded_cap_3000_mib": inside,
        "pass": inside.split(",")[0].strip() == "3000",
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "child":
        what, rest = sys.argv[2], sys.argv[3:]
        try:
            fn = {
                "cap": child_cap,
                "torch_fill": child_torch_fill,
                "cupy_fill": child_cupy_fill,
            }.get(what)
            if fn is not None:
                result = fn(int(rest[0]))
            elif what == "spin":
                result = child_spin(float(rest[0]), int(rest[1]), int(rest[2]) if rest[2:] else 0)
            elif what == "torch_graph":
                result = child_torch_graph(float(rest[0]))
            elif what == "context":
                result = child_context(float(rest[0]))
            else:
                result = child_torch_step(int(rest[0]))
        except ImportError as exc:
            result = {"skipped": str(exc)}
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--launch-bench", required=True)
    parts_all = ["cap", "frameworks", "share", "graphs", "context", "overhead", "smi"]
    parser.add_argument("part", choices=["all", *parts_all])
    args = parser.parse_args()
    uuid = gpu_uuid()
    results: dict = {"uuid": uuid}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        parts = parts_all if args.part == "all" else [args.part]
        for part in parts:
            print(f"-- {part}", flush=True)
            if part == "overhead":
                results[part] = part_overhead(tmp, uuid, args.launch_bench)
            else:
                results[part] = globals()[f"part_{part}"](tmp, uuid)
            print(json.dumps(results[part], indent=1), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    lines = [
        "# libvgpu on a GPU",
        "",
        f"GPU: {uuid}",
        "",
        "```json",
        json.dumps(results, indent=1),
        "```",
    ]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
