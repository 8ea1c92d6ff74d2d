"""Build Tessera's image without a registry or a container daemon: an OCI archive.

    .venv/bin/python image/build.py            # prints the archive's path (stdout)
    make image                                 # the same, after building libvgpu

One image for the scheduler and the node agent (``tessera scheduler``, ``tessera
node-agent``), with libvgpu at /opt/tessera/lib/libvgpu.so. Two layers:

* **base**: Debian 12 (bookworm) from its mirror by ``mmdebstrap`` -- the essential set,
  python3 and CA certificates, no apt, no docs -- plus the non-root user 65532 the
  scheduler runs as. Pinned to the release, not to a snapshot (none is reachable from
  the build machines): the package versions that went in are listed in
  /etc/tessera-base-packages. Cached by its recipe; ``--refresh-base`` rebuilds it
  (security updates).
* **app**: Tessera and its runtime dependencies (pinned by requirements.lock, without
  the dev group and the ``plot`` extra) installed by ``uv`` into
  /opt/tessera/site-packages, byte-compiled, and libvgpu.

``umoci`` (opencontainers) assembles the OCI image layout and its config; the archive is
that layout in a tar, with the ``io.containerd.image.name`` annotation ``ctr images
import`` names the image by. Both tools are Debian packages. The archive lands in
``~/.cache/tessera/image/``, named by a hash of everything that goes in, so an unchanged
checkout reuses it. image/Containerfile builds the same image with a builder of your own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUITE = "bookworm"
PACKAGES = ("python3-minimal", "libpython3.11-stdlib", "libstdc++6", "ca-certificates")  # grpc: C++
USER = 65532
SITE = "/opt/tessera/site-packages"
LIBVGPU = "/opt/tessera/lib/libvgpu.so"
EPOCH = 1767225600  # 2026-01-01: every file of the app layer gets this mtime
EXCLUDES = ("man", "doc", "locale", "info")


def say(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    root = os.environ.get("TESSERA_CACHE_DIR") or (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tessera"
    )
    return Path(root) / "image"


def version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise SystemExit("no version in pyproject.toml")


def need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SystemExit(f"image: `{tool}` not found; install the Debian package {package}")
    return path


def run(argv: list[str], **kw: object) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise SystemExit(f"image: {' '.join(argv[:3])} ... failed:\n{done.stdout}{done.stderr}")


# --- base layer ---------------------------------------------------------------------------


def base_recipe() -> list[str]:
    hooks = [
        f'echo "tessera:x:{USER}:{USER}:tessera:/nonexistent:/usr/sbin/nologin" >> "$1/etc/passwd"',
        f'echo "tessera:x:{USER}:" >> "$1/etc/group"',
        # What went in, with versions: the base is rebuilt from the mirror, not a snapshot.
        "chroot \"$1\" dpkg-query -W -f='${Package} ${Version}\\n'"
        ' > "$1/etc/tessera-base-packages"',
        'rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*',
    ]
    argv = ["mmdebstrap", "--variant=essential", f"--include={','.join(PACKAGES)}", "--mode=root"]
    argv += [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in EXCLUDES]
    argv += [f"--customize-hook={h}" for h in hooks]
    return argv


def base_layer(refresh: bool) -> Path:
    recipe = base_recipe()
    key = hashlib.sha256(json.dumps([SUITE, recipe]).encode()).hexdigest()[:12]
    path = cache_dir() / f"base-{SUITE}-{key}.tar"
    if path.exists() and not refresh:
        return path
    need("mmdebstrap", "mmdebstrap")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    say(f"base: Debian {SUITE} with {', '.join(PACKAGES)} (mmdebstrap, about a minute)")
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(EPOCH))
    run([*recipe, "--format=tar", SUITE, str(tmp)], env=env)
    os.replace(tmp, path)
    return path


# --- app layer ----------------------------------------------------------------------------


def app_inputs(libvgpu: Path) -> str:
    """A hash of everything the app layer is made of."""
    h = hashlib.sha256()
    files = [REPO / "pyproject.toml", REPO / "requirements.lock", Path(__file__), libvgpu]
    for root, dirs, names in os.walk(REPO / "src" / "tessera"):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        files += [Path(root) / n for n in sorted(names) if not n.endswith(".pyc")]
    for f in files:
        h.update(str(f.relative_to(REPO) if f.is_relative_to(REPO) else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def app_layer(dest: Path, libvgpu: Path) -> None:
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    with tempfile.TemporaryDirectory(prefix="tessera-image-") as tmp:
        root = Path(tmp) / "root"
        site = root / SITE.lstrip("/")
        say("app: Tessera and its runtime dependencies (uv, pinned by requirements.lock)")
        run([uv, "pip", "install", "--quiet", "--target", str(site),
             "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36",
             "--constraint", str(REPO / "requirements.lock"), "--compile-bytecode",
             str(REPO)])  # fmt: skip
        for junk in site.glob("*/__pycache__/*.opt-*.pyc"):
            junk.unlink()
        lib = root / LIBVGPU.lstrip("/")
        lib.parent.mkdir(parents=True)
        shutil.copyfile(libvgpu, lib)
        with tarfile.open(dest, "w") as out:
            for path in sorted(root.rglob("*")):
                info = out.gettarinfo(str(path), arcname=str(path.relative_to(root)))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = EPOCH
                if info.isfile():
                    with path.open("rb") as f:
                        out.addfile(info, f)
                else:
                    out.addfile(info)


# --- assembly -----------------------------------------------------------------------------


def assemble(dest: Path, name: str, layers: list[Path]) -> None:
    umoci = need("umoci", "umoci")
    tag = name.rsplit(":", 1)[1]
    with tempfile.TemporaryDirectory(prefix="tessera-oci-") as tmp:
        layout = Path(tmp) / "layout"
        ref = f"{layout}:{tag}"
        run([umoci, "init", "--layout", str(layout)])
        run([umoci, "new", "--image", ref])
        for layer in layers:
            run([umoci, "raw", "add-layer", "--image", ref, str(layer)])
        run([umoci, "config", "--image", ref, "--no-history",
             f"--config.user={USER}:{USER}", "--config.workingdir=/",
             "--config.entrypoint=python3", "--config.entrypoint=-m",
             "--config.entrypoint=tessera.cli",
             f"--config.env=PYTHONPATH={SITE}", "--config.env=PYTHONUNBUFFERED=1",
             "--config.env=PATH=/usr/local/bin:/usr/bin:/bin",
             f"--config.label=org.opencontainers.image.version={tag}",
             "--config.label=org.opencontainers.image.title=tessera"])  # fmt: skip
        index_path = layout / "index.json"
        index = json.loads(index_path.read_text())
        for m in index["manifests"]:
            m.setdefault("annotations", {})["io.containerd.image.name"] = name
        index_path.write_text(json.dumps(index))
        tmp_dest = dest.with_suffix(".part")
        with tarfile.open(tmp_dest, "w") as out:
            for path in sorted(layout.rglob("*")):
                out.add(str(path), arcname=str(path.relative_to(layout)), recursive=False)
        os.replace(tmp_dest, dest)


def build(name: str, libvgpu: Path, refresh_base: bool = False) -> Path:
    if not libvgpu.is_file():
        raise SystemExit(f"image: {libvgpu} not found; run `make libvgpu` first")
    base = base_layer(refresh_base)
    key = hashlib.sha256(f"{base.name}|{app_inputs(libvgpu)}|{name}".encode()).hexdigest()[:12]
    dest = cache_dir() / f"tessera-{version()}-{key}.oci.tar"
    if dest.exists():
        say(f"up to date: {dest}")
        return dest
    with tempfile.TemporaryDirectory(prefix="tessera-layer-") as tmp:
        app = Path(tmp) / "app.tar"
        app_layer(app, libvgpu)
        assemble(dest, name, [base, app])
    for old in sorted(dest.parent.glob("tessera-*.oci.tar"), key=lambda p: p.stat().st_mtime)[:-3]:
        old.unlink()  # keep the three newest builds
    say(f"built {name}: {dest} ({dest.stat().st_size >> 20} MiB, gzip layers)")
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--name", default=f"tessera.local/tessera:{version()}",
                    help="image name (repository:tag) the archive carries")  # fmt: skip
    ap.add_argument("--libvgpu", type=Path, default=REPO / "libvgpu" / "build" / "libvgpu.so")
    ap.add_argument("--refresh-base", action="store_true", help="rebuild the Debian layer")
    args = ap.parse_args()
    print(build(args.name, args.libvgpu, args.refresh_base))


if __name__ == "__main__":
    main()
