#!/usr/bin/env bash
# libvgpu on a real GPU, in one command (a machine with an NVIDIA driver; no CUDA toolkit
# or internet needed; PyTorch / CuPy parts run where they are installed, else are skipped):
#
#   bench/gpu/run.sh            results under $OUT (default out/gpu): results.md, *.json, logs
#
# It builds libvgpu here, then measures (docs/benchmarks.md, "## libvgpu", lists what):
#   1. memory cap through the driver API (ctypes): cap-1 MiB fits, cap+1 MiB is OOM,
#      cuMemGetInfo/cuDeviceTotalMem show the slice, cuGetProcAddress path;
#   2. PyTorch and CuPy filling memory to the cap (OOM at the cap, mem_get_info = slice),
#      PyTorch with expandable segments (VMM, cuMemCreate) and with the cudaMallocAsync
#      backend (stream-ordered pools);
#   3. achieved compute share for 10/30/50/70/90% vs an unlimited run (PTX spin kernel),
#      on the legacy stream and on two non-blocking streams;
#   4. torch.cuda.graph: capture on a side stream and replay under fixed-share 50;
#   5. what one CUDA context costs here (nvidia-smi per process): the --context-mib value;
#   6. interception overhead: launch-heavy loop (C, empty kernel) and a PyTorch training
#      step, native vs preloaded (best-effort, fixed-share 100 and 50);
#   7. nvidia-smi inside a preloaded process.
# The limits come from a file this script writes (the test build's TESSERA_TEST_LIMITS).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/gpu}
mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
echo "== build"
make -C libvgpu WERROR= all >"$OUT/build.log" 2>&1 || { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
cc -O2 -std=gnu11 -Ilibvgpu/include -o "$OUT/launch_bench" bench/gpu/launch_bench.c -ldl || exit 1
nvidia-smi -L | tee "$OUT/gpus.txt"
nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv | tee -a "$OUT/gpus.txt"
PY=${PYTHON:-python3}
$PY -c "import torch; print('torch', torch.__version__, torch.version.cuda)" 2>/dev/null || echo "torch: not installed (torch parts skipped)"
$PY -c "import cupy; print('cupy', cupy.__version__)" 2>/dev/null || echo "cupy: not installed (cupy parts skipped)"
echo "== measurements"
$PY bench/gpu/gpu_bench.py --out "$OUT" --launch-bench "$OUT/launch_bench" all
echo "== done: $OUT/results.md"
