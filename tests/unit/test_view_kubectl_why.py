"""``kubectl tessera why`` reads the pods a page at a time and keeps only their placed
forms: what it finds on every page still counts, for the cards and for the filters."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from tessera.claims.devices import DRIVER, resource_slice
from tessera.kube.fake import FakeKube
from tessera.kube.kinds import (
    DEVICE_CLASSES,
    EVENTS,
    GPUQUOTAS,
    NAMESPACES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from tessera.model.annotations import ASSIGNMENT, PREEMPTING, encode_assignment, encode_preempting
from tessera.model.clusterspec import make_cards
from tessera.model.types import Assignment, CardSlice, ContainerAssignment
from tessera.view import kubectl
from tessera.view.kubectl import common
from tests.unit._claims import claim
from tests.unit._scheduler_world import World, node_obj, pdb, pod_obj, prio_pod, running_pod

HOST = "kubernetes.io/hostname"


def _nodes_a_and_b() -> FakeKube:
    """Nodes a and b, one card each, labelled with their host names (for topology keys)."""
    kube = FakeKube()
    for name in ("a", "b"):
        node = node_obj(name, 1)
        node["metadata"]["labels"] = {HOST: name}
        kube.create(NODES, node)
    return kube


def _waits_away_from_db(**term: Any) -> dict[str, Any]:
    """Pod waits (one card), kept off the hosts of pods labelled app=db; ``term``: more
    fields of its anti-affinity term (namespaces, namespaceSelector)."""
    waits = pod_obj("waits", gpu=1)
    away = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST, **term}
    waits["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [away]}
    }
    return waits


def _why(monkeypatch: pytest.MonkeyPatch, kube: FakeKube, name: str, ns: str = "default") -> str:
    monkeypatch.setattr(common.Conn, "client", lambda self: kube)
    result = CliRunner().invoke(kubectl.app, ["why", name, "-n", ns])
    assert result.exit_code == 0, result.output
    return str(result.output)


def test_what_the_last_page_holds_keeps_the_pod_off(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = _nodes_a_and_b()
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
    kube.create(PODS, _waits_away_from_db(), "default")
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
    kube.create(PODS, pod_obj("small", gpu=1, memory=1000, cores=10, ns="team"), "team")
    uuids = {c.uuid for c in make_cards("a1", 2, "A100")}
    out = _why(monkeypatch, kube, "small", "team")
    assert "pod team/small fits now: node a1, cards " in out
    assert out.split("cards ")[1].split(".")[0] in uuids


def test_namespaces_that_cannot_be_read_are_said_and_named_ones_still_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = _nodes_a_and_b()
    db = pod_obj("db", gpu=None, ns="prod")
    db["metadata"]["labels"] = {"app": "db"}
    db["spec"]["nodeName"] = "a"
    kube.create(PODS, db, "prod")
    waits = _waits_away_from_db(namespaces=["prod"],
                                namespaceSelector={"matchLabels": {"tier": "x"}})  # fmt: skip
    kube.create(PODS, waits, "default")
    kube.unserved.add(NAMESPACES.plural)
    out = _why(monkeypatch, kube, "waits")
    assert out.startswith(
        "namespaces not read (404 NotFound: the server could not find the requested resource):"
        " a namespaceSelector that is not empty selects none; anti-affinity terms count the "
        "namespaces they name, pod affinity terms with such a selector are not weighed\n"
    )
    assert "kube-scheduler's own filters leave out 1 of 2 nodes" in out
    assert "pod anti-affinity: prod/db" in out
    assert "pod default/waits fits now: node b" in out


def test_a_namespace_selector_reads_the_namespaces_labels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = _nodes_a_and_b()
    for ns, labels in (("prod", {"tier": "x"}), ("dev", {})):
        kube.create(NAMESPACES, {"metadata": {"name": ns, "labels": labels}})
        db = pod_obj(f"db-{ns}", gpu=None, ns=ns)
        db["metadata"]["labels"] = {"app": "db"}
        db["spec"]["nodeName"] = "a" if ns == "prod" else "b"
        kube.create(PODS, db, ns)
    kube.create(PODS, _waits_away_from_db(namespaceSelector={"matchLabels": {"tier": "x"}}),
                "default")  # fmt: skip
    out = _why(monkeypatch, kube, "waits")
    assert "namespaces not read" not in out
    assert "kube-scheduler's own filters leave out 1 of 2 nodes" in out
    assert "pod anti-affinity: prod/db-prod" in out and "dev/db-dev" not in out
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
    out = _why(monkeypatch, full, "urgent").splitlines()
    assert out[0].startswith("pod default/urgent fits nowhere")
    assert out[1] == (
        "  preemption: evicting on a1 for cards: default/low-1 (priority 10) would make room"
    )
    never = prio_pod("never", 1000, gpu=1)
    never["spec"]["preemptionPolicy"] = "Never"
    full.create(PODS, never, "default")
    out = _why(monkeypatch, full, "never").splitlines()
    assert out[1] == "  preemption: none (preemptionPolicy: Never)"
    full.seed(POD_DISRUPTION_BUDGETS, pdb("keep", "low", 0), "default")
    out = _why(monkeypatch, full, "urgent").splitlines()
    assert out[1] == (
        "  preemption: evicting on a1 for cards: default/low-1 (priority 10) would make room, "
        "but the Eviction API would refuse default/low-1: PodDisruptionBudget keep needs 2 "
        "healthy pods and has 2 (tried again while the pod waits)"
    )
    peer = prio_pod("peer", 10, gpu=1)  # no pod of lower priority
    full.create(PODS, peer, "default")
    assert _why(monkeypatch, full, "peer").splitlines()[1] == (
        "  preemption: none would help (no pod of lower priority holds cards it could use)"
    )


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


def test_a_pod_on_the_claims_path_is_told_where_each_claim_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Room is counted on the nodes kube-scheduler's filters offer, less what allocated
    claims hold; a claim of the same name in another namespace is not the pod's."""
    kube = FakeKube()
    for n in ("n1", "n2"):
        kube.create(NODES, {"metadata": {"name": n, "labels": {HOST: n}}})
        kube.create(RESOURCE_SLICES, resource_slice(n, make_cards(n, 2, "A100"), generation=1))
    selector = {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    kube.create(DEVICE_CLASSES, {"metadata": {"name": DRIVER}, "spec": {"selectors": [selector]}})
    spec = {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": "8Gi", "compute": "30"}}}
    want = {"metadata": {"name": "want", "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": spec}]}}}  # fmt: skip
    kube.create(RESOURCE_CLAIMS, want, "default")
    theirs = claim("want", memory="1Gi", device="gpu-1", pool="n2", ns="other")
    kube.seed(RESOURCE_CLAIMS, theirs, "other")
    kube.seed(RESOURCE_CLAIMS, claim("held", memory="36Gi", pool="n2", ns="default"), "default")
    p = pod_obj("p", gpu=None)
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "want"}]
    p["spec"]["nodeSelector"] = {HOST: "n2"}
    kube.create(PODS, p, "default")
    ask = f"    request gpu: 1 card(s) of {DRIVER} with 8192 MiB and 30 % compute: "
    head = [
        "kube-scheduler's own filters leave out 1 of 2 nodes — 1 node: nodeSelector "
        f"{HOST}=n2 does not match",
        "pod default/p is on the claims path: kube-scheduler's own allocator places it, not "
        "Tessera's extender",
        "  claim gpu (default/want): not allocated",
    ]
    # Card 0 holds 36 GiB of default/held; card 1 the 1 GiB of other/want, not the pod's.
    room = "room on 1 card(s) of 1 node(s) now (most free: 39936 MiB on n2 card 1)"
    assert _why(monkeypatch, kube, "p").splitlines() == [*head, ask + room]
    kube.unserved.add(DEVICE_CLASSES.plural)
    unread = f"; the selectors of DeviceClass {DRIVER} not read"
    assert _why(monkeypatch, kube, "p").splitlines() == [*head, ask + room + unread]
    kube.unserved = {RESOURCE_SLICES.plural}  # the pod's own claims still say where they stand
    out = _why(monkeypatch, kube, "p").splitlines()
    assert out[2].startswith("note: cannot list resourceslices (404 NotFound)")
    assert out[3:] == [head[2], ask + "no card of the claims path on the nodes it may use"]
    kube.unserved.add(RESOURCE_CLAIMS.plural)  # nor its claims: still an answer
    out = _why(monkeypatch, kube, "p").splitlines()
    assert out[3:] == ["  claim gpu (default/want): no such ResourceClaim"]


def test_a_pod_whose_bind_is_in_flight_is_not_weighed_against_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The extender wrote the pod's assignment; the Binding has not landed. The pod's own
    slice is not counted as someone else's."""
    kube = FakeKube()
    kube.create(NODES, node_obj("a1", 1, "A100"))
    [card] = make_cards("a1", 1, "A100")
    mine = Assignment("a1", (ContainerAssignment("main", (CardSlice(card.uuid, 40960, 100),),
                                                 exclusive=True),))  # fmt: skip
    kube.create(PODS, pod_obj("p", gpu=1, annotations={ASSIGNMENT: encode_assignment(mine)}),
                "default")  # fmt: skip
    out = _why(monkeypatch, kube, "p")
    assert out.startswith(f"pod default/p fits now: node a1, cards {card.uuid}. If it still "
                          "waits, kube-scheduler has not tried it again yet, or something "
                          "other than GPUs holds it (see its events below).")  # fmt: skip


def test_a_pod_refused_or_offered_no_node_is_told_so(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    full.create(PODS, pod_obj("greedy", gpu=1, cores=150), "default")
    out = _why(monkeypatch, full, "greedy")
    assert out.startswith("pod default/greedy is refused: ") and "gpu-cores" in out
    pinned = pod_obj("pinned", gpu=1)
    pinned["spec"]["nodeSelector"] = {HOST: "elsewhere"}
    full.create(PODS, pinned, "default")
    assert _why(monkeypatch, full, "pinned").splitlines()[1:] == [
        "pod default/pinned fits nowhere: kube-scheduler's own filters offer it no node"
    ]


def test_fits_nowhere_counts_the_offered_nodes_and_works_without_quotas_or_budgets(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    full.create(NODES, node_obj("a2", 1, "T4"))
    full.create(PODS, prio_pod("urgent", 1000, gpu=1, memory=20000), "default")
    full.unserved.update({GPUQUOTAS.plural, POD_DISRUPTION_BUDGETS.plural})
    out = _why(monkeypatch, full, "urgent").splitlines()
    assert out[0].startswith("pod default/urgent fits nowhere: 0/2 nodes fit — ")
    assert out[1] == (
        "  preemption: evicting on a1 for cards: default/low-1 (priority 10) would make room "
        "(PodDisruptionBudgets not weighed: 404 NotFound: the server could not find the "
        "requested resource)"
    )


def test_a_preemption_under_way_says_which_victims_are_terminating(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    full.graceful_evictions = True
    for victim in ("low-0", "low-1"):
        full.evict("default", victim, full.get(PODS, victim, "default")["metadata"]["uid"])
    record = encode_preempting("a1", ["default/low-1", "default/low-0"])
    full.create(PODS, prio_pod("urgent", 1000, gpu=1, annotations={PREEMPTING: record}),
                "default")  # fmt: skip
    assert _why(monkeypatch, full, "urgent").splitlines()[1] == (
        "  preemption: under way on a1, the node held for this pod; waiting for "
        "default/low-0 (terminating), default/low-1 (terminating) to go"
    )


def test_events_of_a_pod_of_the_same_name_elsewhere_are_not_shown(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    full.create(PODS, prio_pod("waits", 10, gpu=1), "default")
    for ns in ("default", "other"):
        event = {"metadata": {"name": "e", "namespace": ns},
                 "involvedObject": {"kind": "Pod", "name": "waits", "namespace": ns},
                 "type": "Warning", "reason": "FailedScheduling", "message": f"in {ns}",
                 "lastTimestamp": "2026-11-28T10:00:00Z"}  # fmt: skip
        full.create(EVENTS, event, ns)
    mate = {"metadata": {"name": "m", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "waits-2", "namespace": "default"},
            "type": "Warning", "reason": "FailedScheduling", "message": "of waits-2",
            "lastTimestamp": "2026-11-28T10:00:01Z"}  # fmt: skip
    full.create(EVENTS, mate, "default")
    out = _why(monkeypatch, full, "waits")
    assert "FailedScheduling: in default" in out
    assert "in other" not in out and "of waits-2" not in out


def test_events_recorded_through_events_k8s_io_are_shown_by_their_event_time(
    monkeypatch: pytest.MonkeyPatch, full: FakeKube
) -> None:
    """kube-scheduler records through events.k8s.io/v1: read as core Events, they carry
    ``eventTime`` (the first time) and no ``lastTimestamp``; one that repeated, its
    ``series.lastObservedTime``."""
    full.create(PODS, prio_pod("waits", 10, gpu=1), "default")
    repeated = {
        "eventTime": "2026-11-28T09:00:00.000000Z",
        "lastTimestamp": None,
        "series": {"count": 40, "lastObservedTime": "2026-11-28T10:00:09.000000Z"},
    }
    for name, stamps in (("old", {"lastTimestamp": "2026-11-28T10:00:05Z"}),
                         ("new", {"eventTime": "2026-11-28T10:00:07.000000Z",
                                  "lastTimestamp": None}),
                         ("again", repeated)):  # fmt: skip
        event = {"metadata": {"name": name, "namespace": "default"},
                 "involvedObject": {"kind": "Pod", "name": "waits", "namespace": "default"},
                 "type": "Warning", "reason": "FailedScheduling", "message": name,
                 **stamps}  # fmt: skip
        full.create(EVENTS, event, "default")
    lines = [line.strip() for line in _why(monkeypatch, full, "waits").splitlines()[-3:]]
    assert lines == [
        "2026-11-28T10:00:05Z FailedScheduling: old",
        "2026-11-28T10:00:07.000000Z FailedScheduling: new",
        "2026-11-28T10:00:09.000000Z FailedScheduling: again",
    ]
