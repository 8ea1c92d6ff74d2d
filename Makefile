# The two commands a newcomer runs: `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export PATH := $(HOME)/.local/bin:$(PATH)
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)

.PHONY: demo test setup lint typecheck libvgpu testenv clean

VENV := .venv
BIN := $(VENV)/bin

# uv comes from PyPI; it installs the locked environment (requirements.lock, with
# hashes) into .venv, then Tessera itself in editable mode.
$(UV):
	python3 -m pip install --user --quiet uv || python3 -m pip install --user --quiet --break-system-packages uv

$(VENV)/.synced: requirements.lock pyproject.toml | $(UV)
	test -x $(BIN)/python || $(UV) venv --quiet --python "$$(command -v python3)" $(VENV)
	$(UV) pip sync --quiet --python $(BIN)/python requirements.lock
	$(UV) pip install --quiet --python $(BIN)/python --no-deps -e .
	touch $@

setup: $(VENV)/.synced

demo: setup
	mkdir -p out
	$(BIN)/tessera simulate --plot out/simulate.png --json out/simulate.json

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

# The local control plane the e2e tests run against: built from Go modules on the first
# run (minutes), reused from ~/.cache/tessera afterwards (docs/testenv.md).
testenv: setup
	$(BIN)/python -m tessera.testenv.build

# The in-container limiter, its fake driver and its C tests, normal and under ASan/UBSan
# (pytest runs the C test cases: tests/integration/test_libvgpu.py).
libvgpu:
	$(MAKE) -C libvgpu all asan

test: setup lint testenv libvgpu
	$(BIN)/pytest

clean:
	rm -rf .venv out build
