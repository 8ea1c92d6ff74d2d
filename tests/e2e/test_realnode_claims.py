"""The claims path on a real node: the node agent as the real kubelet's DRA plugin.

The real node (kubelet + containerd) with the agent offering card 1 to claims
(``--claims-cards=1``) and card 0 to the extender. The real kubelet finds the agent's
registration socket and registers it; the real kube-scheduler's DRA allocator allocates
a claim on the agent's ResourceSlice; kubelet calls ``NodePrepareResources`` before the
pod's container starts, containerd applies the CDI spec the agent wrote, and the
container's libvgpu enforces the claim's slice; ``NodeUnprepareResources`` follows once
the pod is gone.

The node runs containerd 1.7 built from its Go module (testenv component
``containerd``): Debian 12's 1.6, which the other real-node tests use, applies no CDI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.claims.devices import slice_name
from tessera.kube.errors import NotFound
from tessera.kube.kinds import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from tessera.node.formats.limits import decode_limits
from tessera.testenv.chart import deployed
from tessera.testenv.process import free_port
from tessera.testenv.realnode import missing_prerequisites
from tests.e2e.realnode import (
    CARDS,
    NODE,
    NS,
    PROBE,
    RealWorld,
    agent_registered,
    gpu_pod,
    probe_facts,
    scheduler_config,
)
from tests.e2e.wait import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites())),
]

REGISTERED = "kubelet registered DRA driver gpu.tessera.io"


@pytest.fixture(scope="module")
def world(testenv_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealWorld]:
    from tessera.testenv import TestEnv, ensure_binaries

    port = free_port()
    env = TestEnv.start(
        tmp_path_factory.mktemp("realnode-claims-cp"),
        binaries=testenv_binaries,
        scheduler_config=scheduler_config(port),
        controller_manager=False,
    )
    root = Path(tempfile.mkdtemp(prefix="ts-rclaim-", dir="/tmp"))
    w: RealWorld | None = None
    try:
        containerd = ensure_binaries(["containerd"])["containerd"]
        cdi = root / "node" / "cdi"  # RealNode.cdi_dir: where containerd reads specs
        metrics = f"--metrics-port={free_port()}"
        faults = f"--fault-dir={root / 'faults'}"  # probe-fail: a card the probe finds broken
        args = ["--claims-cards=1", f"--cdi-dir={cdi}", metrics, faults]
        w = RealWorld(env, root, args, containerd)
        w.start(port)
        for doc in deployed("device-classes.yaml"):
            w.api.create(DEVICE_CLASSES, doc)
        yield w
    finally:
        if w is not None:
            w.stop()
        env.stop()
        shutil.rmtree(root, ignore_errors=True)  # the node's state, images and logs


def _registered(w: RealWorld) -> dict[str, float]:
    port = next(a for a in w.agent.argv if a.startswith("--metrics-port=")).split("=")[1]
    return agent_registered(port)


def _claim(name: str, memory: str, compute: str) -> dict[str, Any]:
    request = {"deviceClassName": "gpu.tessera.io",
               "capacity": {"requests": {"memory": memory, "compute": compute}}}  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def _pod(name: str, claim: str, devices: Path) -> dict[str, Any]:
    """The device plugin path's probe pod (tests/e2e/realnode.py), its slice from a claim."""
    pod = gpu_pod(name, 0, 0, PROBE + "; sleep 3600", devices)
    main = pod["spec"]["containers"][0]
    main["resources"] = {"claims": [{"name": "gpu"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    return pod


def test_kubelet_registers_the_agent_and_prepares_and_unprepares_a_claim(
    world: RealWorld, testenv_binaries: Any
) -> None:
    w = world
    wait_for("kubelet to register the DRA plugin", lambda: REGISTERED in w.agent.log(), 60, 0.2)
    # Card 1 is on claims, card 0 on the extender path: the slice has only card 1.
    slice_ = wait_for(
        "the agent's ResourceSlice",
        lambda: _get(w, RESOURCE_SLICES, slice_name(NODE)),
        30,
    )
    uuids = [d["attributes"]["uuid"]["string"] for d in slice_["spec"]["devices"]]
    assert uuids == [CARDS[1].uuid]

    claim = w.api.create(RESOURCE_CLAIMS, _claim("slice", "4Gi", "30"), NS)
    uid = claim["metadata"]["uid"]
    w.create(_pod("claimer", "slice", w.devices))
    assert w.wait_phase("claimer", ("Running", "Failed")) == "Running", w.diagnose("claimer")
    # Inside the container, through containerd's CDI: the claim's slice, enforced.
    out = wait_for("the probe's report", lambda: "visible=" in (o := w.logs("claimer")) and o,
                   60, 0.5)  # fmt: skip
    facts = probe_facts(out)
    assert facts["rc"] == "0"
    assert (facts["uuid"], facts["total_mib"], facts["filled"], facts["oom"]) == (
        CARDS[1].uuid, "4096", "4096", "1"
    )  # fmt: skip
    assert facts["limits"] == "read-only"
    assert facts["preload"] == "/usr/local/tessera/lib/libvgpu.so"
    assert facts["visible"] == CARDS[1].uuid
    # kubelet called prepare before the container started: the claim's folder and spec.
    folder = w.state / "claims" / uid
    [card] = decode_limits((folder / "etc" / "limits").read_text()).cards
    assert (card.uuid, card.memory_mib, card.cores_percent) == (CARDS[1].uuid, 4096, 30)
    # The CDI library itself agrees on what the spec injects.
    run = subprocess.run(
        [str(testenv_binaries["cdi-inject"]), f"--spec-dir={w.node.cdi_dir}",
         f"gpu.tessera.io/claim={uid}"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    mounts = {m["destination"]: m for m in json.loads(run.stdout)["mounts"]}
    assert mounts["/etc/tessera"]["source"] == str(folder / "etc")
    assert "ro" in mounts["/etc/tessera"]["options"]
    reserved = w.api.get(RESOURCE_CLAIMS, "slice", NS)["status"]["reservedFor"]
    assert [r["name"] for r in reserved] == ["claimer"]

    # kubelet stopped: it leaves its sockets and tells no plugin, yet within the agent's
    # 10 s check /metrics says neither plugin is registered (TesseraAgentNotRegistered).
    registrations = w.agent.log().count(REGISTERED)
    w.node.stop_process("kubelet")
    assert w.node.inside("/var/lib/kubelet/device-plugins/kubelet.sock").exists()
    wait_for("both plugins unregistered in /metrics",
             lambda: _registered(w) == {"device-plugin": 0, "dra": 0}, 20, 0.2,
             lambda: str(_registered(w)))  # fmt: skip
    # Started again: the plugin is registered again and the claim stays prepared.
    w.node.start_kubelet()
    wait_for("kubelet to register the DRA plugin again",
             lambda: w.agent.log().count(REGISTERED) > registrations, 90, 0.2)  # fmt: skip
    # Both of the agent's kubelet plugins are back, as its /metrics says.
    wait_for("both plugins registered in /metrics",
             lambda: _registered(w) == {"device-plugin": 1, "dra": 1}, 30, 0.2,
             lambda: str(_registered(w)))  # fmt: skip
    assert (folder / "etc" / "limits").exists()

    # Gone pod: kubelet unprepares, the folder and the spec go.
    w.delete("claimer")
    wait_for("kubelet to unprepare the claim", lambda: not folder.exists(), 90, 0.2)
    assert not (w.node.cdi_dir / f"gpu.tessera.io-claim_{uid}.json").exists()
    w.api.delete(RESOURCE_CLAIMS, "slice", NS)


def test_a_claim_tenant_past_its_cap_is_killed_by_the_backstop(world: RealWorld) -> None:
    # As on the device plugin path (tests/e2e/test_realnode.py): the tenant zeroes its
    # usage region between allocations; the agent sees the driver's per-process figure
    # and holds the container to its claim's slice.
    w = world
    wait_for("kubelet to register the DRA plugin", lambda: REGISTERED in w.agent.log(), 60, 0.2)
    cap, rounds = 256, 6
    w.api.create(RESOURCE_CLAIMS, _claim("bypass", f"{cap}Mi", "20"), NS)
    pod = _pod("bypasser", "bypass", w.devices)
    script = f"exec tool_bypass /var/run/tessera/usage/region {cap} {rounds}"
    pod["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", script]
    w.create(pod)
    phase = w.wait_phase("bypasser", ("Succeeded", "Failed"), timeout=90)
    assert phase == "Failed", w.diagnose("bypasser")
    state = w.pod("bypasser")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 137, state  # SIGKILL
    assert "bypassed" in w.logs("bypasser")
    [event] = [e for e in w.events("bypasser") if e["reason"] == "TesseraMemoryBackstop"]
    message = event["message"]
    assert f"{cap * rounds} MiB" in message and f"cap of {cap} MiB" in message
    assert CARDS[1].uuid in message
    w.delete("bypasser")
    w.api.delete(RESOURCE_CLAIMS, "bypass", NS)


def _device_health(w: RealWorld, pod: str) -> list[tuple[str, str, str, str]]:
    """What kubelet shows of the pod's claim devices: (name, resource, health, message)."""
    [status] = w.pod(pod)["status"].get("containerStatuses") or [{}]
    shown = status.get("allocatedResourcesStatus") or []
    return [
        (s["name"], r["resourceID"], r["health"], r.get("message", ""))
        for s in shown
        for r in s["resources"]
    ]


def test_kubelet_shows_the_claim_cards_health_in_the_pod_status(world: RealWorld) -> None:
    # kubelet (ResourceHealthStatus, on by default from 1.36) streams the DRA driver's
    # device health into the status of the pods holding those devices.
    w = world
    wait_for("kubelet to register the DRA plugin", lambda: REGISTERED in w.agent.log(), 60, 0.2)
    claim = w.api.create(RESOURCE_CLAIMS, _claim("watched", "1Gi", "10"), NS)
    cdi = f"gpu.tessera.io/claim={claim['metadata']['uid']}"
    w.create(_pod("watched", "watched", w.devices))
    assert w.wait_phase("watched", ("Running", "Failed")) == "Running", w.diagnose("watched")

    def shows(health: str, message: str = "") -> Callable[[], bool]:
        return lambda: _device_health(w, "watched") == [("claim:gpu", cdi, health, message)]

    shown = lambda: str(_device_health(w, "watched"))  # noqa: E731
    wait_for("the card Healthy in the pod status", shows("Healthy"), 30, 0.5, shown)
    faults = w.root / "faults"
    faults.mkdir(exist_ok=True)
    (faults / "probe-fail").write_text(CARDS[1].uuid + "\n")
    wait_for("the card Unhealthy, with why", shows("Unhealthy", "probe failed"), 30, 0.5, shown)
    (faults / "probe-fail").write_text("")
    # Back after the agent's quiet period (30 s, its default), as the pod status says.
    wait_for("the card Healthy again in the pod status", shows("Healthy"), 60, 0.5, shown)
    # kubelet found the health service (without it: an error line every 5 s).
    assert "Error receiving from WatchResources" not in w.node.log("kubelet").read_text()
    w.delete("watched")
    w.wait_phase("watched", ("Gone",), timeout=60)
    w.api.delete(RESOURCE_CLAIMS, "watched", NS)


def _get(w: RealWorld, kind: Any, name: str) -> dict[str, Any] | None:
    try:
        return w.api.get(kind, name)
    except NotFound:
        return None
