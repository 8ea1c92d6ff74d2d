"""Build the control-plane binaries from their Go modules, once, into a versioned cache.

Each component is a small wrapper module under ``testenv/`` (go.mod + go.sum, committed):
the wrapper pins the upstream module and lists the commands to build as ``tool``
directives. The cache directory of a component is named by its upstream version and a
hash of the wrapper's go.mod and go.sum, so changing a pin builds afresh and an unchanged
checkout reuses the binaries at once::

    ~/.cache/tessera/testenv/bin/kubernetes-v1.36.3-<hash>/kube-apiserver
                                 etcd-v3.6.16-<hash>/etcd
                                 kwok-v0.8.0-<hash>/kwok
                                 helm-v3.22.0-<hash>/helm

Go's own module and build caches stay where Go keeps them (GOMODCACHE, GOCACHE); a
second cold build on the same machine reuses them too. Builds run under ``nice`` and
hold a file lock, so two test sessions never build the same thing at the same time.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tessera.testenv.errors import BuildError

__all__ = [
    "COMPONENTS",
    "Binaries",
    "Component",
    "cache_root",
    "ensure_binaries",
    "find_go",
    "module_version",
    "testenv_dir",
]

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Component:
    """One wrapper module under ``testenv/`` and the binaries it yields."""

    name: str  # wrapper directory under testenv/, and the cache prefix
    upstream: str  # module whose version names the cache entry
    binaries: tuple[tuple[str, str], ...]  # (binary name, Go package)
    version_ldflags: tuple[str, ...] = ()  # -X flags; "{version}", "{major}", "{minor}"

    def ldflags(self, version: str) -> str:
        major, minor = _major_minor(version)
        flags = [f.format(version=version, major=major, minor=minor) for f in self.version_ldflags]
        return " ".join(["-s", "-w", *flags])


def _major_minor(version: str) -> tuple[str, str]:
    m = re.match(r"v(\d+)\.(\d+)\.", version)
    return (m.group(1), m.group(2)) if m else ("", "")


_K8S_VERSION = "k8s.io/component-base/version"

COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component(
            name="kubernetes",
            upstream="k8s.io/kubernetes",
            binaries=(
                ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
                ("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
                ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
                # The real node's kubelet (testenv.realnode): one go build with the control
                # plane shares the compile of the packages they have in common.
                ("kubelet", "k8s.io/kubernetes/cmd/kubelet"),
            ),
            # Without these the binaries report v0.0.0-master, and the components'
            # version checks (emulation/compatibility version) misbehave.
            version_ldflags=(
                f"-X {_K8S_VERSION}.gitVersion={{version}}",
                f"-X {_K8S_VERSION}.gitMajor={{major}}",
                f"-X {_K8S_VERSION}.gitMinor={{minor}}",
                f"-X {_K8S_VERSION}.gitTreeState=clean",
            ),
        ),
        Component(
            name="kubectl",
            upstream="k8s.io/kubernetes",
            binaries=(("kubectl", "k8s.io/kubernetes/cmd/kubectl"),),
            version_ldflags=(
                f"-X {_K8S_VERSION}.gitVersion={{version}}",
                f"-X {_K8S_VERSION}.gitMajor={{major}}",
                f"-X {_K8S_VERSION}.gitMinor={{minor}}",
                f"-X {_K8S_VERSION}.gitTreeState=clean",
            ),
        ),
        Component(
            name="etcd",
            upstream="go.etcd.io/etcd/server/v3",
            binaries=(("etcd", "go.etcd.io/etcd/server/v3"),),
        ),
        Component(
            name="kwok",
            upstream="sigs.k8s.io/kwok",
            binaries=(("kwok", "sigs.k8s.io/kwok/cmd/kwok"),),
        ),
        Component(
            name="helm",
            upstream="helm.sh/helm/v3",
            binaries=(("helm", "helm.sh/helm/v3/cmd/helm"),),
            # `helm version` and the chart's kubeVersion checks read these.
            version_ldflags=("-X helm.sh/helm/v3/internal/version.version={version}",),
        ),
        Component(
            # The claims real-node test's runtime: 1.7 applies CDI devices, Debian's 1.6
            # does not.
            name="containerd",
            upstream="github.com/containerd/containerd",
            binaries=(
                ("containerd", "github.com/containerd/containerd/cmd/containerd"),
                (
                    "containerd-shim-runc-v2",
                    "github.com/containerd/containerd/cmd/containerd-shim-runc-v2",
                ),
            ),
            version_ldflags=("-X github.com/containerd/containerd/version.Version={version}",),
        ),
        Component(
            # Our own main (testenv/cdi/main.go) over the CDI library runtimes use: what
            # containerd >= 1.7 would inject for a claim (the real node runs 1.6).
            name="cdi",
            upstream="tags.cncf.io/container-device-interface",
            binaries=(("cdi-inject", "tessera.local/testenv/cdi"),),
        ),
    )
}

# kubectl shares the kubernetes wrapper module; it is built only when asked for.
_MODULE_DIR = {"kubectl": "kubernetes"}

DEFAULT_COMPONENTS = ("etcd", "kubernetes", "kwok", "helm", "cdi", "containerd")


def testenv_dir() -> Path:
    """The checkout's ``testenv/`` directory (override: ``TESSERA_TESTENV_DIR``)."""
    override = os.environ.get("TESSERA_TESTENV_DIR")
    path = Path(override) if override else Path(__file__).resolve().parents[3] / "testenv"
    if not (path / "kubernetes" / "go.mod").is_file():
        raise BuildError(
            f"no Go wrapper modules in {path}: run from a Tessera checkout "
            "or set TESSERA_TESTENV_DIR to its testenv/ directory"
        )
    return path


def cache_root() -> Path:
    """``$TESSERA_CACHE_DIR`` or ``$XDG_CACHE_HOME/tessera`` (default ``~/.cache/tessera``)."""
    override = os.environ.get("TESSERA_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tessera"


def module_version(gomod_text: str, module: str) -> str:
    """The version ``gomod_text`` requires of ``module`` (a go.mod require line)."""
    pattern = rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v[^\s/]+)"
    m = re.search(pattern, gomod_text, flags=re.MULTILINE)
    if not m:
        raise BuildError(f"go.mod does not require {module}")
    return m.group(1)


def find_go() -> str:
    """The ``go`` command: ``$GO``, then PATH, then /usr/local/go/bin/go."""
    candidates = [os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise BuildError(
        "Go toolchain not found (looked at $GO, PATH and /usr/local/go/bin/go): "
        "install Go 1.26 or newer from https://go.dev/dl, or set GO=/path/to/go"
    )


@dataclass(frozen=True, slots=True)
class Binaries:
    """Paths of the built binaries, by name (``kube-apiserver``, ``etcd``, ``kwok`` ...)."""

    paths: dict[str, Path]
    versions: dict[str, str]  # component name -> upstream version

    def __getitem__(self, name: str) -> Path:
        try:
            return self.paths[name]
        except KeyError:
            raise BuildError(f"binary {name!r} was not built; have {sorted(self.paths)}") from None


def _entry_dir(component: Component, module_dir: Path) -> tuple[Path, str]:
    gomod = (module_dir / "go.mod").read_text()
    gosum = (module_dir / "go.sum").read_bytes() if (module_dir / "go.sum").exists() else b""
    version = module_version(gomod, component.upstream)
    sources = b"".join(p.read_bytes() for p in sorted(module_dir.glob("*.go")))  # our mains
    digest = hashlib.sha256(
        gomod.encode() + b"\0" + gosum + b"\0" + component.ldflags(version).encode() + sources
    )
    key = f"{component.name}-{version}-{digest.hexdigest()[:10]}"
    return cache_root() / "testenv" / "bin" / key, version


def _complete(entry: Path, component: Component) -> bool:
    return all(os.access(entry / name, os.X_OK) for name, _ in component.binaries)


def ensure_binaries(
    components: Iterable[str] = DEFAULT_COMPONENTS,
    progress: Progress | None = None,
) -> Binaries:
    """Build what is missing from the cache and return the paths of all binaries."""
    say = progress or (lambda _msg: None)
    root = testenv_dir()
    paths: dict[str, Path] = {}
    versions: dict[str, str] = {}
    for name in components:
        try:
            component = COMPONENTS[name]
        except KeyError:
            raise BuildError(f"unknown component {name!r}; known: {sorted(COMPONENTS)}") from None
        module_dir = root / _MODULE_DIR.get(name, name)
        entry, version = _entry_dir(component, module_dir)
        versions[name] = version
        if not _complete(entry, component):
            entry.parent.mkdir(parents=True, exist_ok=True)
            with _lock(entry.parent / f".{entry.name}.lock"):
                if not _complete(entry, component):  # another process may have built it
                    _build(component, version, module_dir, entry, say)
        for binary, _ in component.binaries:
            paths[binary] = entry / binary
    return Binaries(paths=paths, versions=versions)


class _lock:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _build(
    component: Component, version: str, module_dir: Path, entry: Path, say: Progress
) -> None:
    go = find_go()
    names = ", ".join(b for b, _ in component.binaries)
    packages = [pkg for _, pkg in component.binaries]
    env = dict(
        os.environ, GOTOOLCHAIN="local", GOFLAGS="-mod=readonly -buildvcs=false", CGO_ENABLED="0"
    )
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    log_path = entry.parent / f"{entry.name}.build.log"
    total = _count_packages(go, module_dir, packages, env)
    say(
        f"building {names} {version} from Go modules (first run only; {total} packages, "
        f"log: {log_path})"
    )
    cmd = [
        "nice",
        "-n",
        "10",
        go,
        "build",
        "-v",
        "-trimpath",
        "-ldflags",
        component.ldflags(version),
        "-o",
        # One package: name the file (etcd's package path ends in server/v3). Several:
        # a directory, where each binary is named after its package (cmd/kube-apiserver).
        str(tmp / component.binaries[0][0]) if len(packages) == 1 else str(tmp) + "/",
        *packages,
    ]
    started = time.monotonic()
    compiled = 0
    last_report = started
    # Popen as a context: its stdout pipe is closed when the build ends.
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            cmd,
            cwd=module_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as proc,
    ):
        log.write(" ".join(cmd) + "\n")
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if not line.startswith(("go: ", "#")):
                compiled += 1
            now = time.monotonic()
            if now - last_report >= 30:
                last_report = now
                say(
                    f"  {component.name}: {compiled}/{total} packages compiled, "
                    f"{now - started:.0f} s"
                )
        rc = proc.wait()
    if rc != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-25:])
        raise BuildError(
            f"go build of {names} {version} failed (exit {rc}); "
            f"log: {log_path}; last lines:\n{tail}",
            log=str(log_path),
        )
    tmp.chmod(0o755)
    if entry.exists():
        shutil.rmtree(entry)
    tmp.rename(entry)
    say(f"built {names} {version} in {time.monotonic() - started:.0f} s -> {entry}")


def _count_packages(go: str, module_dir: Path, packages: list[str], env: dict[str, str]) -> int:
    try:
        out = subprocess.run(
            [go, "list", "-deps", *packages],
            cwd=module_dir,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout
    except subprocess.CalledProcessError as exc:
        raise BuildError(
            f"go list in {module_dir} failed (exit {exc.returncode}):\n{exc.stderr[-3000:]}"
        ) from None
    return len(out.split())


def main(argv: list[str] | None = None) -> int:
    """``python -m tessera.testenv.build [COMPONENT...]``: build what is missing, print paths."""
    import sys

    names = (argv if argv is not None else sys.argv[1:]) or list(DEFAULT_COMPONENTS)

    def say(msg: str) -> None:
        print(f"[testenv] {msg}", file=sys.stderr, flush=True)

    started = time.monotonic()
    try:
        binaries = ensure_binaries(names, progress=say)
    except BuildError as exc:
        say(f"error: {exc}")
        return 1
    for name, path in binaries.paths.items():
        print(f"{name}\t{path}")
    say(f"binaries ready in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
