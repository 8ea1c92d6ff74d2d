"""Container images for the real node, made locally: no registry, no Docker daemon.

An image is one uncompressed layer written with ``tarfile`` and packed as an OCI image
layout archive (``oci-layout``, ``index.json``, ``blobs/sha256/...``), which
``ctr images import`` reads. Layers are reproducible: every entry has mtime 0 and owner
root, so the same files give the same digest.

Two images serve the tests:

* ``pause``: the pod sandbox, a static program that waits for a signal;
* ``gpu-probe``: a minimal Linux userland (busybox) with libvgpu's fake libcuda and
  libnvidia-ml where the NVIDIA container toolkit would put the driver's, the glibc the
  tools were linked against, and the probe tools (``tool_slice``, ``tool_bypass``,
  ``tool_usage``). libvgpu itself is not in it: the node agent's Allocate answer mounts it.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import shutil
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tessera.testenv.errors import TestEnvError

__all__ = [
    "GPU_PROBE_IMAGE",
    "PAUSE_IMAGE",
    "ImageFile",
    "build_gpu_probe",
    "build_pause",
    "oci_archive",
]

PAUSE_IMAGE = "tessera.local/pause:1"
GPU_PROBE_IMAGE = "tessera.local/gpu-probe:1"
DRIVER_LIB_DIR = "/usr/lib/x86_64-linux-gnu" if platform.machine() == "x86_64" else "/usr/lib"

_PAUSE_C = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


@dataclass(frozen=True, slots=True)
class ImageFile:
    """One entry of a layer: a file (``source`` or ``data``), a directory or a symlink."""

    path: str  # absolute, in the image
    source: Path | None = None
    data: bytes | None = None
    mode: int = 0o755
    link: str = ""  # symlink target
    directory: bool = False


@dataclass(frozen=True, slots=True)
class ImageConfig:
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ("PATH=/usr/local/bin:/usr/bin:/bin",)
    labels: dict[str, str] = field(default_factory=dict)


def _arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def _layer(files: Iterable[ImageFile]) -> bytes:
    buf = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add_dirs(path: str) -> None:
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in seen:
                    seen.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)

        for f in sorted(files, key=lambda f: f.path):
            name = f.path.strip("/")
            if name in seen:
                continue
            add_dirs(f.path)
            seen.add(name)
            info = tarfile.TarInfo(name)
            info.mode = f.mode
            if f.directory:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif f.link:
                info.type, info.linkname = tarfile.SYMTYPE, f.link
                tar.addfile(info)
            else:
                data = f.data if f.data is not None else Path(str(f.source)).read_bytes()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def oci_archive(dest: Path, name: str, files: Iterable[ImageFile], config: ImageConfig) -> str:
    """Write image ``name`` (``repo:tag``) as an OCI layout archive; its manifest digest."""
    layer = _layer(files)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    cfg = {
        "architecture": _arch(),
        "os": "linux",
        "config": {
            "Entrypoint": list(config.entrypoint) or None,
            "Cmd": list(config.cmd) or None,
            "Env": list(config.env),
            "WorkingDir": "/",
            "Labels": config.labels or None,
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    cfg_bytes = json.dumps(cfg, sort_keys=True).encode()
    cfg_digest = "sha256:" + hashlib.sha256(cfg_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": cfg_digest,
            "size": len(cfg_bytes),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": len(layer),
            }
        ],
    }
    man_bytes = json.dumps(manifest, sort_keys=True).encode()
    man_digest = "sha256:" + hashlib.sha256(man_bytes).hexdigest()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": man_digest,
                "size": len(man_bytes),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
                "platform": {"architecture": _arch(), "os": "linux"},
            }
        ],
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w") as out:

        def put(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            out.addfile(info, io.BytesIO(data))

        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        put("index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in (
            (layer_digest, layer),
            (cfg_digest, cfg_bytes),
            (man_digest, man_bytes),
        ):
            put(f"blobs/sha256/{digest.split(':')[1]}", data)
    return man_digest


def _compile_static(source: str, out: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise TestEnvError("no C compiler (cc) to build the pause image's program")
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".c")
    src.write_text(source)
    done = subprocess.run(
        [cc, "-static", "-O2", "-s", "-o", str(out), str(src)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise TestEnvError(
            f"cannot build the static pause program (is libc6-dev installed?): {done.stderr}"
        )


def build_pause(workdir: Path) -> Path:
    """The sandbox image's archive (built in ``workdir``)."""
    prog = workdir / "pause"
    _compile_static(_PAUSE_C, prog)
    dest = workdir / "pause.oci.tar"
    oci_archive(dest, PAUSE_IMAGE, [ImageFile("/pause", source=prog)], ImageConfig(("/pause",)))
    return dest


def _shared_libs(binaries: Iterable[Path]) -> set[Path]:
    """Every shared library the binaries load (ldd), the loader included."""
    out: set[Path] = set()
    for b in binaries:
        done = subprocess.run(["ldd", str(b)], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
            if path.startswith("/"):
                out.add(Path(path))
    return out


BUSYBOX = Path("/bin/busybox")
_APPLETS = ("sh", "cat", "env", "sleep", "ls", "echo", "grep", "id", "true", "false", "rm")


def build_gpu_probe(workdir: Path, libvgpu_build: Path) -> Path:
    """The GPU probe image's archive, from a built ``libvgpu/build`` folder."""
    if not BUSYBOX.exists():
        raise TestEnvError(
            "the real node's test image needs a static busybox: apt-get install busybox-static"
        )
    tools = [libvgpu_build / "tests" / t for t in ("tool_slice", "tool_bypass", "tool_usage")]
    fakes = [libvgpu_build / "fake" / n for n in ("libcuda.so.1", "libnvidia-ml.so.1")]
    # The libraries libvgpu needs too: it is mounted into the container and preloaded.
    needed = _shared_libs([*tools, libvgpu_build / "libvgpu.so"])
    files = [ImageFile("/bin/busybox", source=BUSYBOX)]
    files += [ImageFile(f"/bin/{a}", link="busybox") for a in _APPLETS]
    files += [ImageFile(f"/usr/local/bin/{t.name}", source=t) for t in tools]
    files += [ImageFile(f"{DRIVER_LIB_DIR}/{f.name}", source=f) for f in fakes]
    files += [
        ImageFile(str(lib), source=lib.resolve())
        for lib in needed
        if lib.name not in ("libcuda.so.1", "libnvidia-ml.so.1")
    ]
    files += [
        ImageFile(
            "/etc/passwd",
            data=b"root:x:0:0::/:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n",
            mode=0o644,
        ),
        ImageFile("/tmp", directory=True, mode=0o1777),
    ]
    dest = workdir / "gpu-probe.oci.tar"
    oci_archive(dest, GPU_PROBE_IMAGE, files, ImageConfig(cmd=("/usr/local/bin/tool_slice",)))
    return dest
