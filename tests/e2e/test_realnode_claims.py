"""The claims path against the real kubelet: the node agent as a DRA kubelet plugin.

The real node (kubelet + containerd) with the agent offering card 1 to claims
(``--claims-cards=1``) and card 0 to the extender. The real kubelet finds the agent's
registration socket and registers it; the real kube-scheduler's DRA allocator allocates
a claim on the agent's ResourceSlice; kubelet calls ``NodePrepareResources`` before the
pod's container starts and ``NodeUnprepareResources`` once the pod is gone.

What this does not show: the container seeing the files. The node's containerd is
Debian 12's 1.6, which does not apply CDI devices (1.7 does, with CDI on). The spec the
agent wrote during the real kubelet's prepare is given instead to the CDI library those
runtimes use (testenv/cdi, ``cdi-inject``), and what it would inject is checked.
docs/claims.md, "Gaps".
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.claims.devices import slice_name
from tessera.kube.errors import NotFound
from tessera.kube.kinds import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from tessera.node.formats.limits import decode_limits
from tessera.testenv.chart import deployed
from tessera.testenv.images import PAUSE_IMAGE
from tessera.testenv.process import free_port
from tessera.testenv.realnode import missing_prerequisites
from tests.e2e.realnode import CARDS, NODE, NS, RealWorld, scheduler_config
from tests.e2e.wait import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(missing_prerequisites()), reason="; ".join(missing_prerequisites())),
]

REGISTERED = "kubelet registered DRA driver gpu.tessera.io"


@pytest.fixture(scope="module")
def world(testenv_binaries: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealWorld]:
    from tessera.testenv import TestEnv

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
        w = RealWorld(env, root, ["--claims-cards=1", f"--cdi-dir={root / 'cdi'}"])
        w.start(port)
        for doc in deployed("device-classes.yaml"):
            w.api.create(DEVICE_CLASSES, doc)
        yield w
    finally:
        if w is not None:
            w.stop()
        env.stop()


def _claim(name: str, memory: str, compute: str) -> dict[str, Any]:
    request = {"deviceClassName": "gpu.tessera.io",
               "capacity": {"requests": {"memory": memory, "compute": compute}}}  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def _pod(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "tessera-scheduler",
            "hostNetwork": True,
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{
                "name": "main", "image": PAUSE_IMAGE, "imagePullPolicy": "Never",
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        },
    }  # fmt: skip


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
    w.create(_pod("claimer", "slice"))
    assert w.wait_phase("claimer", ("Running", "Failed")) == "Running", w.diagnose("claimer")
    # kubelet called prepare before the container started: the claim's folder and spec.
    folder = w.state / "claims" / uid
    [card] = decode_limits((folder / "etc" / "limits").read_text()).cards
    assert (card.uuid, card.memory_mib, card.cores_percent) == (CARDS[1].uuid, 4096, 30)
    # What a CDI runtime (containerd >= 1.7) would do with it, by the CDI library itself.
    run = subprocess.run(
        [str(testenv_binaries["cdi-inject"]), f"--spec-dir={w.root / 'cdi'}",
         f"gpu.tessera.io/claim={uid}"], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    mounts = {m["destination"]: m for m in json.loads(run.stdout)["mounts"]}
    assert mounts["/etc/tessera"]["source"] == str(folder / "etc")
    assert "ro" in mounts["/etc/tessera"]["options"]
    reserved = w.api.get(RESOURCE_CLAIMS, "slice", NS)["status"]["reservedFor"]
    assert [r["name"] for r in reserved] == ["claimer"]

    # A kubelet restart: the plugin is registered again and the claim stays prepared.
    registrations = w.agent.log().count(REGISTERED)
    w.node.restart_kubelet()
    wait_for("kubelet to register the DRA plugin again",
             lambda: w.agent.log().count(REGISTERED) > registrations, 90, 0.2)  # fmt: skip
    assert (folder / "etc" / "limits").exists()

    # Gone pod: kubelet unprepares, the folder and the spec go.
    w.delete("claimer")
    wait_for("kubelet to unprepare the claim", lambda: not folder.exists(), 90, 0.2)
    assert not (w.root / "cdi" / f"gpu.tessera.io-claim_{uid}.json").exists()
    w.api.delete(RESOURCE_CLAIMS, "slice", NS)


def _get(w: RealWorld, kind: Any, name: str) -> dict[str, Any] | None:
    try:
        return w.api.get(kind, name)
    except NotFound:
        return None
