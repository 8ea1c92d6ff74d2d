"""GPU pods on a real node: the real kubelet and containerd, placed by the real
kube-scheduler with Tessera's extender, their cards handed over by ``tessera node-agent``
through the device plugin protocol, and their slice enforced by libvgpu in the container
(over the fake driver, which sees exactly the cards the Allocate answer names).

One node for the whole module (starting it costs a few seconds); each test leaves no pod
behind.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.model import annotations
from tessera.model.annotations import decode_assignment
from tessera.testenv.process import free_port
from tessera.testenv.realnode import missing_prerequisites
from tests.e2e.realnode import CARDS, RealWorld, gpu_pod, scheduler_config

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites())),
]

SLICE = re.compile(r"card (\d+) uuid=(\S+) total_mib=(\d+) free_mib=(\d+)")
FILL = re.compile(r"fill (\d+) ok=(\d+) oom=(\d)")
PROBE = (
    "tool_slice; echo rc=$?; "
    "if (echo x >> /etc/tessera/limits) 2>/dev/null; then echo limits=writable; "
    "else echo limits=read-only; fi; "
    "echo preload=$(cat /etc/ld.so.preload); echo visible=$NVIDIA_VISIBLE_DEVICES"
)


@pytest.fixture(scope="module")
def world(testenv_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealWorld]:
    from tessera.testenv import TestEnv

    port = free_port()
    env = TestEnv.start(
        tmp_path_factory.mktemp("realnode-cp"),
        binaries=testenv_binaries,
        scheduler_config=scheduler_config(port),
        controller_manager=False,
    )
    # Short: unix socket paths inside it (the agent's plugin socket is not, but the
    # node's containerd state is reached through /proc/<pid>/root).
    root = Path(tempfile.mkdtemp(prefix="ts-real-", dir="/tmp"))
    w: RealWorld | None = None
    try:
        w = RealWorld(env, root)
        w.start(port)
        yield w
    finally:
        if w is not None:
            w.stop()
        env.stop()


def probe(world: RealWorld, name: str, memory: int, cores: int = 30) -> dict[str, str]:
    """Run the probe pod to completion; what it printed, parsed."""
    world.create(gpu_pod(name, memory, cores, PROBE, world.devices))
    assert world.wait_phase(name, ("Succeeded", "Failed")) == "Succeeded", world.diagnose(name)
    out = world.logs(name)
    world.delete(name)
    facts = dict(line.split("=", 1) for line in out.splitlines() if line.count("=") == 1)
    (m,) = SLICE.findall(out)
    (f,) = FILL.findall(out)
    facts.update(uuid=m[1], total_mib=m[2], free_mib=m[3], filled=f[1], oom=f[2])
    return facts


def assigned_card(pod: dict[str, Any]) -> str:
    text = pod["metadata"]["annotations"][annotations.ASSIGNMENT]
    a = decode_assignment(pod["metadata"]["name"], text)
    return a.containers[0].slices[0].uuid


def test_a_gpu_pod_sees_exactly_its_slice(world: RealWorld) -> None:
    facts = probe(world, "slice-a", memory=1000)
    assert facts["rc"] == "0"
    assert facts["total_mib"] == "1000" and facts["filled"] == "1000" and facts["oom"] == "1"
    assert facts["limits"] == "read-only"
    assert facts["preload"] == "/usr/local/tessera/lib/libvgpu.so"
    assert facts["visible"] == facts["uuid"]
    assert facts["uuid"] in {c.uuid for c in CARDS}


def test_a_tenant_past_its_cap_is_killed_by_the_backstop(world: RealWorld) -> None:
    # The tenant zeroes its usage region between allocations, so libvgpu lets it allocate
    # its cap again and again; the agent sees the driver's per-process figure and kills it.
    cap, rounds = 256, 6
    script = f"exec tool_bypass /var/run/tessera/usage/region {cap} {rounds}"
    world.create(gpu_pod("bypass", cap, 20, script, world.devices))
    assert world.wait_phase("bypass", ("Succeeded", "Failed"), timeout=60) == "Failed"
    pod = world.pod("bypass")
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 137, state  # SIGKILL
    assert "bypassed" in world.logs("bypass")
    [event] = [e for e in world.events("bypass") if e["reason"] == "TesseraMemoryBackstop"]
    message = event["message"]
    assert "container 'main'" in message and f"{cap * rounds} MiB" in message
    assert f"cap of {cap} MiB" in message and "killed pid" in message
    assert event["type"] == "Warning"
    world.delete("bypass")
    # The card is usable by the next pod, with its own limits.
    assert probe(world, "after-bypass", memory=700)["total_mib"] == "700"
