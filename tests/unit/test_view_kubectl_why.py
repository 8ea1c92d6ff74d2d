"""``kubectl tessera why`` reads the pods a page at a time and keeps only their placed
forms: what it finds on every page still counts, for the cards and for the filters."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from tessera.kube.fake import FakeKube
from tessera.kube.kinds import EVENTS, NAMESPACES, NODES, POD_DISRUPTION_BUDGETS, PODS
from tessera.model.annotations import ASSIGNMENT, PREEMPTING, encode_assignment, encode_preempting
from tessera.model.clusterspec import make_cards
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.view import kubectl
from tessera.view.kubectl import common
from tests.unit._scheduler_world import World, node_obj, pdb, pod_obj, prio_pod, running_pod

HOST = "kubernetes.io/hostname"


def _why(monkeypatch: pytest.MonkeyPatch, kube: FakeKube, name: str) -> str:
    monkeypatch.setattr(common.Conn, "client", lambda self: kube)
    result = CliRunner().invoke(kubectl.app, ["why", name, "-n", "default"])
    assert result.exit_code == 0, result.output
    return str(result.output)


def test_what_the_last_page_holds_keeps_the_pod_off(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    for name in ("a", "b"):
        node = node_obj(name, 1)
        node["metadata"]["labels"] = {HOST: name}
        kube.create(NODES, node)
    for i in range(600):  # a first page and more of pods without a GPU
        filler = pod_obj(f"filler-{i:03d}", gpu=None)
        filler["spec"]["nodeName"] = "a"
        kube.create(PODS, filler, "default")
    # On the last page: a training pod holding node a's card, and a db pod on node b.
    card = make_cards("a", 1, "A100")[0]
    whole = ContainerAssignment("main", (CardSlice(card.uuid, 40960, 100),), exclusive=True)
    held = Assignment("a", (whole,))
    train = pod_obj("zz-train", gpu=1, annotations={ASSIGNMENT: encode_assignment(held)})
    train["spec"]["nodeName"] = "a"
    kube.create(PODS, train, "default")
    db = pod_obj("zz-db", gpu=None)
    db["metadata"]["labels"] = {"app": "db"}
    db["spec"]["nodeName"] = "b"
    kube.create(PODS, db, "default")
    waits = pod_obj("waits", gpu=1)
    away = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST}
    waits["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [away]}
    }
    kube.create(PODS, waits, "default")
    assert len(kube.list(PODS, limit=500).items) == 500  # so the last ones are on page 2

    out = _why(monkeypatch, kube, "waits")
    assert "kube-scheduler's own filters leave out 1 of 2 nodes" in out
    assert "pod anti-affinity: default/zz-db" in out
    assert "pod default/waits fits nowhere" in out


# --- what `why` says in each case, against a FakeKube the scheduler placed pods in ------


@pytest.fixture
def full() -> Any:
    """Node a1's two cards held by two pods of priority 10, Running and Ready (app=low),
    placed by the scheduler; the scheduler stopped, so nothing preempts behind `why`."""
    w = World([node_obj("a1", 2, "A100")])
    for i in range(2):
        assert w.schedule(w.create(running_pod(f"low-{i}", 10, "low"))) == "a1"
    w.app.stop()
    yield w.kube
    w.kube.close()


def test_a_bound_pod_is_placed(monkeypatch: pytest.MonkeyPatch, full: FakeKube) -> None:
    assert "pod default/low-0 is placed: bound to a1" in _why(monkeypatch, full, "low-0")


def test_a_pod_that_fits_is_told_its_node_and_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.create(NODES, node_obj("a1", 2, "A100"))
    kube.create(PODS, pod_obj("small", gpu=1, memory=1000, cores=10), "default")
    uuids = {c.uuid for c in make_cards("a1", 2, "A100")}
    out = _why(monkeypatch, kube, "small")
    assert "pod default/small fits now: node a1, cards " in out
    assert out.split("cards ")[1].split(".")[0] in uuids


def test_namespaces_that_cannot_be_read_are_said_and_named_ones_still_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = FakeKube()
    for name in ("a", "b"):
        node = node_obj(name, 1)
        node["metadata"]["labels"] = {HOST: name}
        kube.create(NODES, node)
    db = pod_obj("db", gpu=None, ns="prod")
    db["metadata"]["labels"] = {"app": "db"}
    db["spec"]["nodeName"] = "a"
    kube.create(PODS, db, "prod")
    waits = pod_obj("waits", gpu=1)
    away = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST,
            "namespaces": ["prod"],
            "namespaceSelector": {"matchLabels": {"tier": "x"}}}  # fmt: skip
    waits["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [away]}
    }
    kube.create(PODS, waits, "default")
    kube.unserved.add(NAMESPACES.plural)
    out = _why(monkeypatch, kube, "waits")
    assert "namespaces not read (404 NotFound: " in out
    assert "anti-affinity terms count the namespaces they name" in out
    assert "kube-scheduler's own filters leave out 1 of 2 nodes" in out
    assert "pod anti-affinity: prod/db" in out
    assert "pod default/waits fits now: node b" in out


def test_a_pod_without_a_gpu_or_on_the_claims_path_is_not_the_extenders(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    full.create(PODS, pod_obj("web", gpu=None), "default")
    out = _why(monkeypatch, full, "web")
    assert "pod default/web asks for no Tessera GPU resource" in out
    claimant = pod_obj("claimant", gpu=None)
    claimant["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "one"}]
    full.create(PODS, claimant, "default")
    out = _why(monkeypatch, full, "claimant")
    assert "pod default/claimant is on the claims path" in out
    # A pod asking Tessera's resources and a claim besides (a NIC, say) is the extender's.
    both = prio_pod("both", 1000, gpu=1)
    both["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimName": "nic"}]
    full.create(PODS, both, "default")
    out = _why(monkeypatch, full, "both")
    assert "claims path" not in out and "pod default/both fits nowhere" in out


def test_the_preemption_line_follows_the_pods_policy_and_the_budgets(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    urgent = prio_pod("urgent", 1000, gpu=1)
    full.create(PODS, urgent, "default")
    out = _why(monkeypatch, full, "urgent")
    assert "pod default/urgent fits nowhere" in out
    assert "default/low-1 (priority 10) would make room" in out
    never = prio_pod("never", 1000, gpu=1)
    never["spec"]["preemptionPolicy"] = "Never"
    full.create(PODS, never, "default")
    assert "preemption: none (preemptionPolicy: Never)" in _why(monkeypatch, full, "never")
    full.seed(POD_DISRUPTION_BUDGETS, pdb("keep", "low", 0), "default")
    out = _why(monkeypatch, full, "urgent")
    assert "would make room, but the Eviction API would refuse default/low-" in out
    assert "PodDisruptionBudget keep needs 2 healthy pods and has 2" in out
    peer = prio_pod("peer", 10, gpu=1)  # no pod of lower priority
    full.create(PODS, peer, "default")
    assert "preemption: none would help" in _why(monkeypatch, full, "peer")


def test_a_preemption_under_way_names_the_victims_left(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    record = encode_preempting("a1", ["default/low-1", "default/gone"])
    urgent = prio_pod("urgent", 1000, gpu=1, annotations={PREEMPTING: record})
    full.create(PODS, urgent, "default")
    out = _why(monkeypatch, full, "urgent")
    assert ("preemption: under way on a1, the node held for this pod; waiting for "
            "default/low-1 to go") in out  # fmt: skip
    broken = prio_pod("broken", 1000, gpu=1, annotations={PREEMPTING: "{"})
    full.create(PODS, broken, "default")
    assert f"preemption: pod default/broken: annotation {PREEMPTING}" in _why(
        monkeypatch, full, "broken"
    )


def test_a_preemption_whose_victims_are_gone_is_weighed_again(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    over = encode_preempting("a1", ["default/gone"])
    full.create(PODS, prio_pod("late", 1000, gpu=1, annotations={PREEMPTING: over}), "default")
    out = _why(monkeypatch, full, "late")
    assert "under way" not in out and "default/low-1 (priority 10) would make room" in out


def test_the_last_three_warnings_are_shown_oldest_first(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    full.create(PODS, prio_pod("waits", 10, gpu=1), "default")
    for i, (kind, when) in enumerate([("Warning", "12"), ("Warning", "10"), ("Normal", "14"),
                                      ("Warning", "13"), ("Warning", "11")]):  # fmt: skip
        event = {
            "metadata": {"name": f"e{i}", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "waits", "namespace": "default"},
            "type": kind,
            "reason": f"R{i}",
            "message": f"m{i}",
            "lastTimestamp": f"2026-11-28T10:00:{when}Z",
        }
        full.create(EVENTS, event, "default")
    out = _why(monkeypatch, full, "waits")
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("2026")]
    assert lines == [
        "2026-11-28T10:00:11Z R4: m4",
        "2026-11-28T10:00:12Z R0: m0",
        "2026-11-28T10:00:13Z R3: m3",
    ]
