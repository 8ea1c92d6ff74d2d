# The two commands a newcomer runs: `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export PATH := $(HOME)/.local/bin:$(PATH)
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)

.PHONY: demo test setup lint typecheck libvgpu testenv node-packages clean

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
# (pytest runs the C test cases: tests/integration/test_libvgpu.py). The library itself is
# built with zig cc (PyPI's ziglang, in .venv) against glibc 2.17: it loads in any image.
libvgpu: setup
	$(MAKE) -C libvgpu all asan ZIG="$(abspath $(BIN))/python -m ziglang"

# The real node of the e2e tests (docs/testenv.md, "The real node"): containerd, runc and
# the CNI plugins from Debian, a static busybox and glibc's static library for the test
# images. Installed as root with apt-get; elsewhere the real-node tests skip and say why.
NODE_PACKAGES := containerd runc containernetworking-plugins busybox-static libc6-dev
node-packages:
	@if dpkg -s $(NODE_PACKAGES) >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing the real node's packages: $(NODE_PACKAGES)"; \
	  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(NODE_PACKAGES) >/dev/null; \
	else echo "not root with apt-get: the real-node tests will skip (they need $(NODE_PACKAGES))"; fi

test: setup lint testenv libvgpu node-packages
	$(BIN)/pytest

clean:
	rm -rf .venv out build
