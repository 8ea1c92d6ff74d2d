"""Build helpers that need no Go: versions from go.mod, cache location, missing Go."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.testenv import build
from tessera.testenv.errors import BuildError


def test_module_version_reads_require_lines() -> None:
    text = (
        "module x\n\nrequire (\n\tk8s.io/api v0.36.3 // indirect\n\tk8s.io/kubernetes v1.36.3\n)\n"
    )
    assert build.module_version(text, "k8s.io/kubernetes") == "v1.36.3"
    assert build.module_version("require sigs.k8s.io/kwok v0.8.0\n", "sigs.k8s.io/kwok") == "v0.8.0"
    with pytest.raises(BuildError, match=r"does not require k8s\.io/kubernetes"):
        build.module_version("module x\n", "k8s.io/kubernetes")


def test_module_version_does_not_match_a_longer_module_path() -> None:
    text = "require (\n\tgo.etcd.io/etcd/server/v3 v3.6.16\n\tgo.etcd.io/etcd/api/v3 v3.6.1\n)\n"
    assert build.module_version(text, "go.etcd.io/etcd/server/v3") == "v3.6.16"


def test_committed_wrappers_pin_the_versions_we_document() -> None:
    root = build.testenv_dir()
    versions = {
        name: build.module_version((root / name / "go.mod").read_text(), c.upstream)
        for name, c in build.COMPONENTS.items()
        if name != "kubectl"
    }
    assert versions["kubernetes"].startswith("v1.36.")
    assert versions["etcd"].startswith("v3.6.")
    # Every staging module is replaced by the v0.x.y matching k8s.io/kubernetes v1.x.y.
    gomod = (root / "kubernetes" / "go.mod").read_text()
    staging = "v0." + versions["kubernetes"].removeprefix("v1.")
    assert f"k8s.io/client-go => k8s.io/client-go {staging}" in gomod


def test_cache_root_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path / "c"))
    assert build.cache_root() == tmp_path / "c"
    monkeypatch.delenv("TESSERA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert build.cache_root() == tmp_path / "x" / "tessera"


def test_missing_go_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GO", "/nonexistent/go")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(build.os, "access", lambda *_: False)
    with pytest.raises(BuildError, match="Go toolchain not found"):
        build.find_go()


def test_unknown_component_is_refused() -> None:
    with pytest.raises(BuildError, match="unknown component 'kubelet'"):
        build.ensure_binaries(["kubelet"])


def test_ldflags_stamp_the_kubernetes_version() -> None:
    flags = build.COMPONENTS["kubernetes"].ldflags("v1.36.3")
    assert "-X k8s.io/component-base/version.gitVersion=v1.36.3" in flags
    assert "-X k8s.io/component-base/version.gitMinor=36" in flags


FAKE_GO = """#!/bin/sh
# go list -deps PKG...: three packages. go build ... -o OUT PKG: two compiled, OUT written.
case "$1" in
  list) printf 'example.com/a\\nexample.com/b\\nexample.com/cmd/tool\\n' ;;
  build)
    while [ "$1" != "-o" ]; do shift; done
    echo example.com/a; echo example.com/cmd/tool
    [ -n "$FAKE_GO_FAIL" ] && { echo "# example.com/cmd/tool: $FAKE_GO_FAIL"; exit 1; }
    echo built > "$2" ;;
esac
"""


@pytest.mark.parametrize("fail", ["", "undefined: main"])
def test_a_build_logs_each_line_and_leaves_the_binary_or_names_the_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail: str
) -> None:
    # Under filterwarnings=error this also fails if the build's output pipe is left open.
    go = tmp_path / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    monkeypatch.setenv("GO", str(go))
    monkeypatch.setenv("FAKE_GO_FAIL", fail)
    component = build.Component("tool", "example.com/tool", (("tool", "./cmd/tool"),))
    entry = tmp_path / "cache" / "tool-v1"
    entry.parent.mkdir()
    said: list[str] = []
    log = entry.parent / "tool-v1.build.log"
    if fail:
        with pytest.raises(BuildError, match="go build of tool v1 failed \\(exit 1\\)") as err:
            build._build(component, "v1", tmp_path, entry, said.append)
        assert err.value.log == str(log)
        assert str(err.value).endswith(f"example.com/cmd/tool\n# example.com/cmd/tool: {fail}\n")
        assert not entry.exists() and list(entry.parent.glob(".tool-v1.*")) == []
    else:
        build._build(component, "v1", tmp_path, entry, said.append)
        assert (entry / "tool").read_text() == "built\n"
        assert said[0].startswith("building tool v1 from Go modules (first run only; 3 packages")
        assert said[-1].startswith("built tool v1 in ")
    lines = log.read_text().splitlines()
    assert lines[0].startswith(f"nice -n 10 {go} build -v -trimpath -ldflags -s -w -o ")
    assert lines[1:3] == ["example.com/a", "example.com/cmd/tool"]
