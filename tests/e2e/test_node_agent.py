"""The node agent on the real control plane: inventory, a burst placed by the real
kube-scheduler + Tessera extender, allocated by the test kubelet in kubelet's order,
with an agent restart and a kubelet restart in the middle; bad input; health.

The agent runs as ``tessera node-agent --backend fake`` (a child process) for a kwok
node that starts with no inventory; the test kubelet (tests/integration/kubelet_double.py)
speaks the device plugin and pod-resources protocols to it over unix sockets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.kube.kinds import EVENTS, PODS
from tessera.model import annotations
from tessera.model.annotations import decode_assignment
from tessera.node.formats.layout import CONTAINER_ETC_DIR
from tessera.node.formats.limits import decode_limits, limits_for
from tests.e2e.agent_world import NODE, NS, SLOTS, World, gpu_pod, kpod, world
from tests.e2e.wait import wait_for
from tests.integration.kubelet_double import AdmissionError

pytestmark = pytest.mark.e2e

__all__ = ["world"]  # the fixture, imported


def test_burst_on_an_agent_node_with_restarts_in_the_middle(world: World) -> None:
    w = world
    inv = wait_for("the agent to publish the inventory", w.inventory, timeout=60)
    assert len(inv.cards) == 4 and all(c.healthy for c in inv.cards)
    w.kubelet.wait_devices(4 * SLOTS, timeout=30)

    names = [f"burst-{i:02d}" for i in range(12)]
    for i, name in enumerate(names):
        w.api.create(PODS, gpu_pod(name, memory=1000 + 250 * i, cores=5 + i), NS)

    def placed() -> list[dict[str, Any]] | None:
        pods = [w.pod(n) for n in names]
        ok = all(
            p["spec"].get("nodeName") == NODE
            and annotations.ASSIGNMENT in (p["metadata"].get("annotations") or {})
            for p in pods
        )
        return pods if ok else None

    try:
        pods = wait_for("the burst to be bound with assignments", placed, timeout=120)
    except BaseException:
        p0 = w.pod(names[0])
        ext = w.extender.log()[-4000:] if w.extender else ""
        raise AssertionError(
            f"{names[0]} status: {p0.get('status')}\nextender log:\n{ext}\n"
            f"kube-scheduler log:\n{w.env.log('kube-scheduler').read_text()[-3000:]}"
        ) from None
    per_card: dict[str, int] = {}
    for p in pods:
        text = p["metadata"]["annotations"][annotations.ASSIGNMENT]
        for s in decode_assignment("-", text).containers[0].slices:
            per_card[s.uuid] = per_card.get(s.uuid, 0) + 1
    assert max(per_card.values()) >= 2  # pending pods hold different slices of one card
    # kubelet admits oldest first.
    pods.sort(key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
    for n, p in enumerate(pods):
        if n == 4:  # agent restart in the middle
            w.agent.stop()
            w.agent.start()
            regs = len(w.kubelet.registrations)
            wait_for("re-registration", lambda r=regs: len(w.kubelet.registrations) > r)
            w.kubelet.wait_devices(4 * SLOTS, timeout=30)
        if n == 8:  # kubelet restart in the middle
            w.kubelet.restart()
            w.kubelet.wait_devices(4 * SLOTS, timeout=30)
        started = w.kubelet.run(kpod(p))
        meta = p["metadata"]
        assignment = decode_assignment(
            f"{NS}/{meta['name']}", meta["annotations"][annotations.ASSIGNMENT]
        )
        (ca,) = assignment.containers
        (s,) = started
        uuids = [x.uuid for x in ca.slices]
        assert s.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
        assert [d.split("::")[0] for d in s.devices] == uuids
        host = Path(s.mount(CONTAINER_ETC_DIR).host_path)
        assert decode_limits((host / "limits").read_text()) == limits_for(ca, card_order=uuids)
    # No slot was handed to two containers.
    held = [d for ids in w.kubelet.pod_devices.values() for d in ids]
    assert len(held) == len(set(held)) == len(names)


def test_bad_input_gets_a_clear_error_and_an_event(world: World) -> None:
    w = world
    wait_for("the agent to publish the inventory", w.inventory, timeout=60)
    w.kubelet.wait_devices(4 * SLOTS, timeout=30)
    # Bound straight to the node, around the scheduler: no assignment.
    created = w.api.create(PODS, gpu_pod("rogue", 1000, 10, node=NODE), NS)
    with pytest.raises(AdmissionError) as info:
        w.kubelet.run(kpod(created))
    assert info.value.status == grpc.StatusCode.FAILED_PRECONDITION
    assert f"{NS}/rogue" in str(info.value) and annotations.ASSIGNMENT in str(info.value)

    def event() -> list[dict[str, Any]]:
        items = w.api.list(EVENTS, NS).items
        return [e for e in items if e["involvedObject"].get("name") == "rogue"]

    (ev,) = wait_for("a Warning Event on the pod", event, timeout=30)
    assert ev["type"] == "Warning" and annotations.ASSIGNMENT in ev["message"]
    # A malformed annotation on a bound pod: same, with the decoder's message.
    bad = gpu_pod("garbled", 1000, 10, node=NODE)
    bad["metadata"]["annotations"] = {annotations.ASSIGNMENT: "{not json"}
    created = w.api.create(PODS, bad, NS)
    with pytest.raises(AdmissionError, match="not valid JSON"):
        w.kubelet.run(kpod(created))
    # The agent is still serving.
    assert w.agent.proc is not None and w.agent.proc.poll() is None


def test_xid_marks_the_card_unhealthy_in_the_inventory_and_it_recovers(world: World) -> None:
    w = world
    inv = wait_for("the agent to publish the inventory", w.inventory, timeout=60)
    w.kubelet.wait_devices(4 * SLOTS, timeout=30)
    uuid = inv.cards[2].uuid
    (w.root / "faults" / "probe-fail").write_text(uuid + "\n")
    with (w.root / "faults" / "xid").open("a") as f:
        f.write(f"{uuid} 79\n")

    def health() -> list[bool]:
        i = w.inventory()
        return [c.healthy for c in i.cards] if i else []

    wait_for("the card Unhealthy in the inventory", lambda: health() == [True, True, False, True])
    assert w.kubelet.health_of(uuid) == {"Unhealthy"}
    (w.root / "faults" / "probe-fail").write_text("")
    wait_for("the card Healthy again", lambda: all(health()) and len(health()) == 4)
    assert w.kubelet.wait(lambda: w.kubelet.health_of(uuid) == {"Healthy"}, timeout=10)
