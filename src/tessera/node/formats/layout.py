"""Where the node agent keeps things on the host, and what each container gets mounted.

Host layout under the state directory (``--state-dir``, ``/var/lib/tessera`` by default;
byte for byte in docs/protocol.md, "## Device plugin"):

    lib/<version>/libvgpu.so          the library, one folder per content hash, never
    lib/<version>/ld.so.preload       modified once written; its preload line
    containers/<alloc-id>/meta.json   the agent's record of the allocation (not mounted)
    containers/<alloc-id>/etc/limits  -> /etc/tessera/limits (folder mounted read-only)
    containers/<alloc-id>/usage/      -> /var/run/tessera/usage (read-write)
    containers/<alloc-id>/allowance/  -> /var/run/tessera/allowance (read-only)
    claims/<claim-uid>/...            the same four for a DRA claim (meta.json is the
                                      claim's record), through its CDI spec
    mps/pipe/, mps/log/               the MPS control daemon's folders (mps backend)

An agent upgrade that ships a new library writes a new ``lib/<version>/``; containers
already running keep the folder they were given at Allocate, and the agent removes a
version only when no allocation refers to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.errors import FormatError

log = logging.getLogger(__name__)

__all__ = [
    "ALLOWANCE_IN_FOLDER",
    "CONTAINER_ALLOWANCE_DIR",
    "CONTAINER_ETC_DIR",
    "CONTAINER_LIB_DIR",
    "CONTAINER_USAGE_DIR",
    "LD_SO_PRELOAD",
    "LIMITS_IN_FOLDER",
    "REGION_IN_FOLDER",
    "AllocRecord",
    "Layout",
    "atomic_write",
]

CONTAINER_ETC_DIR = "/etc/tessera"  # holds `limits` (tessera.node.formats.limits.LIMITS_PATH)
CONTAINER_USAGE_DIR = "/var/run/tessera/usage"
CONTAINER_ALLOWANCE_DIR = "/var/run/tessera/allowance"
CONTAINER_LIB_DIR = "/usr/local/tessera/lib"
LD_SO_PRELOAD = "/etc/ld.so.preload"
LIBRARY = "libvgpu.so"
META_VERSION = 1


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` by temp file + rename: readers see old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# Inside an allocation's or a claim's folder.
LIMITS_IN_FOLDER = Path("etc/limits")
REGION_IN_FOLDER = Path("usage/region")
ALLOWANCE_IN_FOLDER = Path("allowance/allowance")


def _write_folder(d: Path, limits_text: str, meta_json: str) -> None:
    for sub in ("etc", "usage", "allowance"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d / "usage", 0o777)  # the container's processes, any uid, write their usage
    atomic_write(d / LIMITS_IN_FOLDER, limits_text, 0o444)
    atomic_write(d / "meta.json", meta_json + "\n", 0o600)


@dataclass(frozen=True, slots=True)
class AllocRecord:
    """One container's allocation: kubelet's slot IDs and who the agent matched them to."""

    alloc_id: str
    slots: tuple[str, ...]
    pod_uid: str
    namespace: str
    pod: str
    container: str
    cards: tuple[str, ...]  # visible order
    confirmed: bool  # matched by kubelet's own pod-resources report
    lib_version: str
    created: float

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": META_VERSION,
                "allocId": self.alloc_id,
                "slots": list(self.slots),
                "pod": {"uid": self.pod_uid, "namespace": self.namespace, "name": self.pod},
                "container": self.container,
                "cards": list(self.cards),
                "confirmed": self.confirmed,
                "lib": self.lib_version,
                "created": self.created,
            },
            sort_keys=True,
        )

    @staticmethod
    def from_json(what: str, text: str) -> AllocRecord:
        try:
            o: Any = json.loads(text)
            version = o.get("v")
            if version != META_VERSION:
                raise FormatError(
                    what,
                    f"unknown version {version!r}; this Tessera reads v{META_VERSION}",
                    "unknown_version",
                )
            return AllocRecord(
                alloc_id=str(o["allocId"]),
                slots=tuple(o["slots"]),
                pod_uid=str(o["pod"]["uid"]),
                namespace=str(o["pod"]["namespace"]),
                pod=str(o["pod"]["name"]),
                container=str(o["container"]),
                cards=tuple(o["cards"]),
                confirmed=bool(o["confirmed"]),
                lib_version=str(o["lib"]),
                created=float(o["created"]),
            )
        except FormatError:
            raise  # already says what is wrong (a FormatError is a ValueError)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FormatError(what, f"not a valid allocation record: {exc}") from exc


class Layout:
    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir)
        self.lib_root = self.root / "lib"
        self.containers = self.root / "containers"
        self.claims = self.root / "claims"
        self.mps_pipe = self.root / "mps" / "pipe"
        self.mps_log = self.root / "mps" / "log"

    # --- library ---------------------------------------------------------------------

    def install_library(self, source: str | Path | None) -> str:
        """Install ``source`` as ``lib/<version>/`` (content-addressed); return the version.

        Idempotent: the same bytes give the same version and the folder is not touched.
        ``None`` (no library, e.g. a fake node) gives version ``none`` with an empty
        preload file.
        """
        if source is None:
            version = "none"
            folder = self.lib_root / version
            if not folder.exists():
                atomic_write(folder / "ld.so.preload", "")
            return version
        data = Path(source).read_bytes()
        version = hashlib.sha256(data).hexdigest()[:16]
        folder = self.lib_root / version
        if (folder / LIBRARY).exists():
            return version
        self.lib_root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.lib_root, prefix=f".{version}."))
        try:
            shutil.copyfile(source, tmp / LIBRARY)
            os.chmod(tmp / LIBRARY, 0o755)
            (tmp / "ld.so.preload").write_text(f"{CONTAINER_LIB_DIR}/{LIBRARY}\n")
            os.chmod(tmp, 0o755)
            os.rename(tmp, folder)  # fails if another agent won the race: fine, same bytes
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (folder / LIBRARY).exists():
                raise
        return version

    def lib_dir(self, version: str) -> Path:
        return self.lib_root / version

    def lib_versions(self) -> list[str]:
        if not self.lib_root.exists():
            return []
        return sorted(p.name for p in self.lib_root.iterdir() if not p.name.startswith("."))

    # --- allocations -----------------------------------------------------------------

    def alloc_dir(self, alloc_id: str) -> Path:
        return self.containers / alloc_id

    def limits_path(self, alloc_id: str) -> Path:
        return self.alloc_dir(alloc_id) / LIMITS_IN_FOLDER

    def region_path(self, alloc_id: str) -> Path:
        return self.alloc_dir(alloc_id) / REGION_IN_FOLDER

    def allowance_path(self, alloc_id: str) -> Path:
        return self.alloc_dir(alloc_id) / ALLOWANCE_IN_FOLDER

    def write_alloc(self, record: AllocRecord, limits_text: str) -> None:
        """Create or rewrite the allocation's folder; the limits file is replaced atomically."""
        _write_folder(self.alloc_dir(record.alloc_id), limits_text, record.to_json())

    def read_allocs(self) -> list[AllocRecord]:
        """The allocations' records. A folder without one (the agent died in Allocate,
        which writes the record last) is passed over: cleanup removes it. A record that
        does not read (another version's agent, a damaged disk) is passed over and
        logged: its container may still run, so cleanup keeps its folder."""
        out: list[AllocRecord] = []
        if not self.containers.exists():
            return out
        for d in sorted(self.containers.iterdir()):
            meta = d / "meta.json"
            try:
                out.append(AllocRecord.from_json(str(meta), meta.read_text()))
            except FileNotFoundError:
                continue
            except (OSError, FormatError) as exc:
                log.warning("%s; its folder is kept: remove it once its container is gone", exc)
        return out

    def has_record(self, alloc_id: str) -> bool:
        """Whether the allocation's folder holds a record, readable or not."""
        return (self.alloc_dir(alloc_id) / "meta.json").exists()

    def alloc_ids(self) -> list[str]:
        if not self.containers.exists():
            return []
        return sorted(p.name for p in self.containers.iterdir())

    def remove_alloc(self, alloc_id: str) -> None:
        d = self.alloc_dir(alloc_id)
        # The record first: a removal that stops half-way (an I/O error) leaves a folder
        # without one, which cleanup removes again, not one it keeps as unreadable.
        with contextlib.suppress(FileNotFoundError):
            (d / "meta.json").unlink()
        shutil.rmtree(d, ignore_errors=True)

    # --- claims (DRA) -----------------------------------------------------------------

    def claim_dir(self, uid: str) -> Path:
        return self.claims / uid

    def write_claim(self, uid: str, limits_text: str, meta_json: str) -> None:
        """Create or rewrite a prepared claim's folder (same files as an allocation's)."""
        _write_folder(self.claim_dir(uid), limits_text, meta_json)

    def read_claim_meta(self, uid: str) -> str | None:
        try:
            return (self.claim_dir(uid) / "meta.json").read_text()
        except OSError:
            return None

    def claim_uids(self) -> list[str]:
        if not self.claims.exists():
            return []
        return sorted(p.name for p in self.claims.iterdir())

    def remove_claim(self, uid: str) -> None:
        shutil.rmtree(self.claim_dir(uid), ignore_errors=True)

    def remove_lib(self, version: str) -> None:
        shutil.rmtree(self.lib_dir(version), ignore_errors=True)
