"""``kubectl tessera why`` reads the pods a page at a time and keeps only their placed
forms: what it finds on every page still counts, for the cards and for the filters."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from tessera.kube.fake import FakeKube
from tessera.kube.kinds import NODES, PODS
from tessera.model.annotations import ASSIGNMENT, encode_assignment
from tessera.model.clusterspec import make_cards
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.view import kubectl
from tessera.view.kubectl import common
from tests.unit._scheduler_world import node_obj, pod_obj

HOST = "kubernetes.io/hostname"


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
    monkeypatch.setattr(common.Conn, "client", lambda self: kube)

    result = CliRunner().invoke(kubectl.app, ["why", "waits", "-n", "default"])
    out: Any = result.output
    assert result.exit_code == 0, out
    assert "kube-scheduler's own filters leave out 1 of 2 nodes" in out
    assert "pod anti-affinity: default/zz-db" in out
    assert "pod default/waits fits nowhere" in out
