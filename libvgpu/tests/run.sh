#!/usr/bin/env bash
# Run libvgpu's C tests: run.sh BUILD_DIR [PROGRAM [CASE]]
#
# Host tests (host_*) run as they are. Driver tests (drv_*) run as an application would:
# linked against the fake libcuda/libnvidia-ml from BUILD_DIR/fake, with the test build of
# libvgpu preloaded. In a sanitizer build (BUILD_DIR/.asan-runtime exists) the ASan runtime
# is preloaded first, as it must be. Without PROGRAM every case of every test runs.
set -u
B=$(cd "$1" && pwd)
shift
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$B/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
preload="$B/libvgpu-test.so"
export VGT_PRELOAD_PREFIX=""
if [ -f "$B/.asan-runtime" ]; then
  VGT_PRELOAD_PREFIX="$(cat "$B/.asan-runtime")"
  preload="$VGT_PRELOAD_PREFIX $preload"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
  export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fi
export VGT_PRELOAD="$preload" VGT_PROD_LIB="$B/libvgpu.so" VGT_TEST_LIB="$B/libvgpu-test.so"
# Cases write limits files and regions under $TMPDIR: one private directory per run.
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/libvgpu-tests.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

run_case() { # program case
  if [[ $1 == host_* ]]; then "$B/tests/$1" "$2"; else LD_PRELOAD="$preload" "$B/tests/$1" "$2"; fi
}

if [ $# -ge 2 ]; then
  run_case "$1" "$2"
  exit $?
fi

progs=("$@")
if [ ${#progs[@]} -eq 0 ]; then
  for p in "$B"/tests/host_* "$B"/tests/drv_*; do progs+=("$(basename "$p")"); done
fi
failed=0
for p in "${progs[@]}"; do
  for c in $("$B/tests/$p" --list); do
    if out=$(run_case "$p" "$c" 2>&1); then
      echo "ok   $p $c"
    else
      echo "FAIL $p $c"
      printf '%s\n' "$out" | sed 's/^/     /'
      failed=$((failed + 1))
    fi
  done
done
[ $failed -eq 0 ] && echo "all libvgpu tests passed" || echo "$failed libvgpu test case(s) failed"
[ $failed -eq 0 ]
