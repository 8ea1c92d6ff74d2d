# The two commands a newcomer runs: `make demo` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export PATH := $(HOME)/.local/bin:$(PATH)
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)

.PHONY: demo test setup lint typecheck libvgpu image testenv deploy debian-packages mutate clean

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
	$(BIN)/ruff check src tests bench image
	$(BIN)/mypy

# The local control plane the e2e tests run against: built from Go modules on the first
# run (minutes), reused from ~/.cache/tessera afterwards (docs/testenv.md).
testenv: setup
	$(BIN)/python -m tessera.testenv.build

# deploy/ is the Helm chart (charts/tessera) rendered with its defaults, for plain-manifest
# installs and the e2e tests; edit the chart, then run this (a test fails on drift).
deploy: testenv
	$(BIN)/python -m tessera.testenv.chart

# The in-container limiter, its fake driver and its C tests, normal and under ASan/UBSan
# (pytest runs the C test cases: tests/integration/test_libvgpu.py). The library itself is
# built with zig cc (PyPI's ziglang, in .venv) against glibc 2.17: it loads in any image.
libvgpu: setup
	$(MAKE) -C libvgpu all asan ZIG="$(abspath $(BIN))/python -m ziglang"

# The one image of the scheduler and the node agent, with libvgpu, as an OCI archive in
# ~/.cache/tessera/image (no registry, no daemon: mmdebstrap and umoci from Debian, uv;
# image/build.py). Import it with `ctr images import`, or push it with skopeo.
image: libvgpu debian-packages
	$(BIN)/python image/build.py

# Debian packages of the e2e tests: the real node's (docs/testenv.md, "The real node":
# containerd, runc and the CNI plugins, a static busybox and glibc's static library for the
# test images), Prometheus for the monitoring test (the dashboards' queries), Chromium
# for the GPU map page's test, mmdebstrap and umoci for the image. Installed as root with
# apt-get; elsewhere those tests skip and say why.
DEBIAN_PACKAGES := containerd runc containernetworking-plugins busybox-static libc6-dev \
	prometheus chromium mmdebstrap umoci
debian-packages:
	@if dpkg -s $(DEBIAN_PACKAGES) >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing the e2e tests' packages: $(DEBIAN_PACKAGES)"; \
	  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(DEBIAN_PACKAGES) >/dev/null; \
	else echo "not root with apt-get: the real-node and monitoring tests will skip (they need $(DEBIAN_PACKAGES))"; fi

test: setup lint testenv libvgpu debian-packages
	$(BIN)/pytest

# Mutation testing (docs/testing.md), not part of `make test`; one module at a time:
#   make mutate MUTANTS='tessera.scheduler.placer*'
mutate: setup
	@test -n "$(MUTANTS)" || { echo "usage: make mutate MUTANTS='tessera.scheduler.placer*' (the whole tree takes days)"; exit 2; }
	$(BIN)/mutmut run --max-children "$$(nproc)" '$(MUTANTS)'
	$(BIN)/mutmut results | grep -v ': not checked$$' || true

clean:
	rm -rf .venv out build mutants
