# The two commands a newcomer runs: `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export PATH := $(HOME)/.local/bin:$(PATH)
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)

.PHONY: demo test setup lint typecheck libvgpu testenv clean

# uv comes from PyPI; it installs the locked environment into .venv.
$(UV):
	python3 -m pip install --user --quiet uv

.venv/.synced: pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen --quiet
	touch $@

setup: .venv/.synced

demo: setup
	mkdir -p out
	$(UV) run --frozen tessera simulate --plot out/simulate.png --json out/simulate.json

lint: setup
	$(UV) run --frozen ruff check src tests bench
	$(UV) run --frozen mypy

# The local control plane the e2e tests run against: built from Go modules on the first
# run (minutes), reused from ~/.cache/tessera afterwards (docs/testenv.md).
testenv: setup
	$(UV) run --frozen python -m tessera.testenv.build

# The in-container limiter, its fake driver and its C tests, normal and under ASan/UBSan
# (pytest runs the C test cases: tests/integration/test_libvgpu.py).
libvgpu:
	$(MAKE) -C libvgpu all asan

test: setup lint testenv libvgpu
	$(UV) run --frozen pytest

clean:
	rm -rf .venv out build
