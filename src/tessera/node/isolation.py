"""What a container gets, per isolation backend: environment, mounts, visible cards.

Two backends, chosen per node (``--isolation``):

* ``hook``: libvgpu, preloaded through a read-only ``/etc/ld.so.preload``; the limits
  come only from the read-only ``/etc/tessera/limits`` (docs/protocol.md, "## libvgpu").
* ``mps``: NVIDIA MPS. The agent runs the MPS control daemon (``MpsDaemon``); each
  container is an MPS client with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` set from its slice. Those two are environment
  variables the client hands the server, so under MPS a container *can* raise them:
  the mps backend is for cooperating tenants (docs/node-agent.md says so).

Environment carries only what is not a limit in the hook backend.
"""

from __future__ import annotations

import enum
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tessera.model.types import ContainerAssignment
from tessera.node.formats import layout as L
from tessera.node.ports import MpsControl

__all__ = [
    "ContainerEdits",
    "FakeMps",
    "Isolation",
    "Mount",
    "MpsDaemon",
    "MpsSupervisor",
    "Visibility",
    "container_edits",
]

CONTAINER_MPS_PIPE = "/tmp/nvidia-mps"
CDI_KIND = "nvidia.com/gpu"


class Isolation(enum.StrEnum):
    HOOK = "hook"
    MPS = "mps"


class Visibility(enum.StrEnum):
    ENV = "env"  # NVIDIA_VISIBLE_DEVICES=<uuid>,... (nvidia-container-toolkit)
    CDI = "cdi"  # CDI device names nvidia.com/gpu=<uuid> (nvidia-ctk generated spec)


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    cdi_devices: tuple[str, ...] = ()


def container_edits(
    assignment: ContainerAssignment,
    alloc_dir: Path,
    lib_dir: Path,
    isolation: Isolation,
    visibility: Visibility,
    mps_pipe: Path,
    alloc_id: str,
) -> ContainerEdits:
    """The Allocate answer for one container (pure: paths in, edits out). ``mps_pipe``
    is the host's MPS pipe folder (used by the mps backend); ``alloc_id`` names the
    allocation in the container's environment, for logs ("" leaves it out)."""
    uuids = [s.uuid for s in assignment.slices]
    envs: dict[str, str] = {}
    cdi: tuple[str, ...] = ()
    if visibility is Visibility.CDI:
        cdi = tuple(f"{CDI_KIND}={u}" for u in uuids)
    else:
        envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    mounts = [
        Mount(L.CONTAINER_ETC_DIR, str(alloc_dir / "etc"), True),
        Mount(L.CONTAINER_USAGE_DIR, str(alloc_dir / "usage"), False),
        Mount(L.CONTAINER_ALLOWANCE_DIR, str(alloc_dir / "allowance"), True),
    ]
    if isolation is Isolation.HOOK:
        mounts += [
            Mount(L.CONTAINER_LIB_DIR, str(lib_dir), True),
            Mount(L.LD_SO_PRELOAD, str(lib_dir / "ld.so.preload"), True),
        ]
    else:
        mounts.append(Mount(CONTAINER_MPS_PIPE, str(mps_pipe), False))
        envs["CUDA_MPS_PIPE_DIRECTORY"] = CONTAINER_MPS_PIPE
        cores = 100 if assignment.exclusive else max(s.cores_percent for s in assignment.slices)
        if cores > 0:
            envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cores)
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{i}={s.memory_mib}M" for i, s in enumerate(assignment.slices)
        )
    if alloc_id:
        envs["TESSERA_ALLOC_ID"] = alloc_id  # for logs and `tessera top`; not a limit
    return ContainerEdits(envs=envs, mounts=tuple(mounts), cdi_devices=cdi)


# --- MPS control daemon ---------------------------------------------------------------


class MpsDaemon:
    """``nvidia-cuda-mps-control -d`` with its pipe and log folders under the state dir."""

    def __init__(self, pipe_dir: Path, log_dir: Path, binary: str = "nvidia-cuda-mps-control"):
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.binary = binary

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        return env

    def start(self) -> None:
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"{self.binary} not found on PATH (is the NVIDIA driver installed?)")
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([self.binary, "-d"], env=self._env(), check=True, timeout=10)

    def running(self) -> bool:
        # The control daemon answers on its pipe; get_server_list fails when it is gone.
        try:
            r = subprocess.run(
                [self.binary],
                input="get_server_list\n",
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=5,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        return r.returncode == 0

    def stop(self) -> None:
        subprocess.run(
            [self.binary], input="quit\n", env=self._env(), text=True, timeout=10, check=False
        )


class FakeMps:
    """An MPS control daemon for tests: ``crash()`` makes it stop answering."""

    def __init__(self) -> None:
        self.starts = 0
        self._up = False

    def start(self) -> None:
        self.starts += 1
        self._up = True

    def running(self) -> bool:
        return self._up

    def stop(self) -> None:
        self._up = False

    def crash(self) -> None:
        self._up = False


class MpsSupervisor:
    """Starts the daemon and restarts it when it stops answering (``check`` every tick)."""

    def __init__(self, control: MpsControl) -> None:
        self.control = control
        self.restarts = 0
        self._lock = threading.Lock()
        self._started = False

    def check(self) -> bool:
        """Ensure the daemon is up; True when it had to be (re)started."""
        with self._lock:
            if self._started and self.control.running():
                return False
            self.control.start()
            if self._started:
                self.restarts += 1
            self._started = True
            return True
