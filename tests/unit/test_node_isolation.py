from __future__ import annotations

from pathlib import Path

from tessera.model.types import CardSlice, ContainerAssignment
from tessera.node.isolation import (
    FakeMps,
    Isolation,
    MpsSupervisor,
    Visibility,
    container_edits,
)

CA = ContainerAssignment("c", (CardSlice("GPU-a", 4096, 30), CardSlice("GPU-b", 4096, 30)))
ALLOC, LIB, PIPE = Path("/s/containers/x"), Path("/s/lib/v1"), Path("/s/mps/pipe")


def mounts(edits) -> dict[str, tuple[str, bool]]:  # type: ignore[no-untyped-def]
    return {m.container_path: (m.host_path, m.read_only) for m in edits.mounts}


def test_hook_backend_mounts_library_preload_and_limits_read_only() -> None:
    e = container_edits(CA, ALLOC, LIB, Isolation.HOOK, Visibility.ENV, PIPE, "x")
    assert e.envs == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "TESSERA_ALLOC_ID": "x"}
    assert mounts(e) == {
        "/etc/tessera": ("/s/containers/x/etc", True),
        "/var/run/tessera/usage": ("/s/containers/x/usage", False),
        "/var/run/tessera/allowance": ("/s/containers/x/allowance", True),
        "/usr/local/tessera/lib": ("/s/lib/v1", True),
        "/etc/ld.so.preload": ("/s/lib/v1/ld.so.preload", True),
    }
    assert e.cdi_devices == ()


def test_cdi_visibility_names_devices_instead_of_the_env() -> None:
    e = container_edits(CA, ALLOC, LIB, Isolation.HOOK, Visibility.CDI, PIPE)
    assert e.cdi_devices == ("nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b")
    assert "NVIDIA_VISIBLE_DEVICES" not in e.envs


def test_mps_backend_sets_per_client_limits_and_mounts_the_pipe() -> None:
    e = container_edits(CA, ALLOC, LIB, Isolation.MPS, Visibility.ENV, PIPE)
    assert e.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert e.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"
    assert e.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert mounts(e)["/tmp/nvidia-mps"] == ("/s/mps/pipe", False)
    assert "/etc/ld.so.preload" not in mounts(e)  # no libvgpu under MPS


def test_mps_supervisor_starts_and_restarts_the_daemon() -> None:
    mps = FakeMps()
    sup = MpsSupervisor(mps)
    assert sup.check() and mps.starts == 1
    assert not sup.check()
    mps.crash()
    assert sup.check() and mps.starts == 2 and sup.restarts == 1
