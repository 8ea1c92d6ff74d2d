from __future__ import annotations

from pathlib import Path

import pytest

from tessera.model.types import CardSlice, ComputePolicy, ContainerAssignment
from tessera.node.isolation import (
    FakeMps,
    Isolation,
    MpsDaemon,
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
    e = container_edits(CA, ALLOC, LIB, Isolation.HOOK, Visibility.CDI, PIPE, "")
    assert e.cdi_devices == ("nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b")
    assert e.envs == {}  # no NVIDIA_VISIBLE_DEVICES, and no allocation named


def test_mps_backend_sets_per_client_limits_and_mounts_the_pipe() -> None:
    e = container_edits(CA, ALLOC, LIB, Isolation.MPS, Visibility.ENV, PIPE, "x")
    assert e.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert e.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"
    assert e.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert mounts(e)["/tmp/nvidia-mps"] == ("/s/mps/pipe", False)
    assert "/etc/ld.so.preload" not in mounts(e)  # no libvgpu under MPS


def test_mps_compute_share_is_the_whole_card_when_exclusive_and_unset_when_best_effort() -> None:
    whole = ContainerAssignment("c", (CardSlice("GPU-a", 40960, 100),), exclusive=True)
    e = container_edits(whole, ALLOC, LIB, Isolation.MPS, Visibility.ENV, PIPE, "x")
    assert e.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    best = ContainerAssignment("c", (CardSlice("GPU-a", 2048, 0),), ComputePolicy.BEST_EFFORT)
    e = container_edits(best, ALLOC, LIB, Isolation.MPS, Visibility.ENV, PIPE, "x")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in e.envs  # MPS's default: no cap
    assert e.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    # exclusive wins over the slice's own share; a share of 1 % is still a cap
    lent = ContainerAssignment("c", (CardSlice("GPU-a", 40960, 50),), exclusive=True)
    e = container_edits(lent, ALLOC, LIB, Isolation.MPS, Visibility.ENV, PIPE, "x")
    assert e.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    thin = ContainerAssignment("c", (CardSlice("GPU-a", 1024, 1),))
    e = container_edits(thin, ALLOC, LIB, Isolation.MPS, Visibility.ENV, PIPE, "x")
    assert e.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


# A stand-in for NVIDIA's control program: `-d` starts the daemon (a file), otherwise
# it reads commands on stdin and fails as the real one does when no daemon answers.
FAKE_CONTROL = """#!/bin/sh
echo "$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$CALLS"
[ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -d "$CUDA_MPS_LOG_DIRECTORY" ] || exit 3
if [ "$1" = "-d" ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
[ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] || exit 1
read -r cmd
echo "stdin $cmd" >> "$CALLS"
[ "$cmd" = get_server_list ] && echo 4242
[ "$cmd" = quit ] && rm "$CUDA_MPS_PIPE_DIRECTORY/control"
exit 0
"""


def _control(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    control = tmp_path / "bin" / "mps-control"
    control.parent.mkdir()
    control.write_text(FAKE_CONTROL)
    control.chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("CALLS", str(calls))
    return control, calls


def test_the_mps_daemon_is_started_asked_and_stopped_through_its_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    control, calls = _control(tmp_path, monkeypatch)
    # under a state folder not made yet, as on a node's first start
    pipe, log = tmp_path / "state" / "mps" / "pipe", tmp_path / "state" / "mps" / "log"
    daemon = MpsDaemon(pipe, log, binary=str(control))
    assert not daemon.running()  # its folders are not made yet: nothing answers
    daemon.start()
    assert daemon.running()
    daemon.stop()
    assert not daemon.running()
    assert calls.read_text().splitlines() == [
        f" pipe={pipe} log={log}",
        f"-d pipe={pipe} log={log}",
        f" pipe={pipe} log={log}",
        "stdin get_server_list",
        f" pipe={pipe} log={log}",
        "stdin quit",
        f" pipe={pipe} log={log}",
    ]
    assert capfd.readouterr().out == ""  # the server list asked every tick stays off the log


def test_a_stopped_mps_daemon_starts_again_and_stopping_one_that_is_gone_is_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control, _ = _control(tmp_path, monkeypatch)
    daemon = MpsDaemon(tmp_path / "pipe", tmp_path / "log", binary=str(control))
    daemon.start()
    daemon.stop()
    daemon.stop()  # nothing answers now: the control program fails, and stop lets it
    daemon.start()  # its folders are there from the first start
    assert daemon.running()


def test_the_mps_daemon_is_nvidias_control_program_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"^nvidia-cuda-mps-control not found on PATH"):
        MpsDaemon(tmp_path / "pipe", tmp_path / "log").start()


def test_an_mps_daemon_that_is_not_installed_is_named(tmp_path: Path) -> None:
    daemon = MpsDaemon(tmp_path / "pipe", tmp_path / "log", binary="no-such-mps-control")
    with pytest.raises(RuntimeError, match="no-such-mps-control not found on PATH"):
        daemon.start()
    assert not daemon.running()


def test_mps_supervisor_starts_and_restarts_the_daemon() -> None:
    mps = FakeMps()
    sup = MpsSupervisor(mps)
    assert sup.check() and mps.starts == 1
    assert not sup.check()
    mps.crash()
    assert sup.check() and mps.starts == 2 and sup.restarts == 1
    mps.crash()
    assert sup.check() and mps.starts == 3 and sup.restarts == 2
