"""The commands that read the GPU map -- ``kubectl tessera top``, ``pod``, ``capacity`` and
``quota`` -- against a FakeKube the scheduler placed pods in: the filters, the orders, the
wide columns, the live use, the sums per model and the quotas' rows (tests/e2e runs them
on the real control plane with the viewer role)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tessera.claims.devices import DRIVER
from tessera.kube.errors import ApiError
from tessera.kube.fake import FakeKube
from tessera.kube.kinds import GPUQUOTAS, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES
from tessera.model.annotations import ASSIGNMENT, COMPUTE_POLICY, GPU_UUID, INVENTORY
from tessera.model.clusterspec import make_cards
from tessera.view import kubectl, prom
from tessera.view.kubectl import common
from tests.unit._claims import a_slice, claim
from tests.unit._scheduler_world import World, gpu_quota, node_obj, pod_obj

A0, A1 = (c.uuid for c in make_cards("a1", 2, "A100"))
[T0] = (c.uuid for c in make_cards("t1", 1, "T4"))


@pytest.fixture
def placed(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    """a1: card 0 holds train (team-a, 12000 MiB 30 %) and infer (team-b, 4000 MiB 10 %,
    burst-share); card 1 is free and sick. t1: its one T4 held whole by whole (team-a),
    then cordoned. waits (team-b) asks for a B200 the cluster lacks."""
    w = World([node_obj("a1", 2, "A100", sick=(1,)), node_obj("t1", 1, "T4")])
    pods = [
        pod_obj("train", gpu=None, memory=12000, cores=30, ns="team-a",
                annotations={GPU_UUID: A0}),
        pod_obj("infer", gpu=None, memory=4000, cores=10, ns="team-b",
                annotations={GPU_UUID: A0, COMPUTE_POLICY: "burst-share"}),
        pod_obj("whole", gpu=1, ns="team-a", annotations={GPU_UUID: T0}),
    ]  # fmt: skip
    for p in pods:
        assert w.schedule(w.create(p))
    waits = pod_obj("waits", gpu=None, memory=8000, ns="team-b",
                    annotations={"tessera.io/gpu-model": "B200"})  # fmt: skip
    assert w.schedule(w.create(waits)) is None
    w.app.stop()
    monkeypatch.setattr(common.Conn, "client", lambda self: w.kube)
    monkeypatch.setattr(common.Conn, "namespace", lambda self, given: given or "team-a")
    assert _run("cordon", "t1", "0").startswith("node t1: card 0")
    yield w.kube
    w.kube.close()


def _run(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(kubectl.app, list(args))
    assert result.exit_code == code, result.output
    return str(result.output)


def _rows(text: str) -> list[dict[str, str]]:
    """A table's rows by header, cut where each header starts (every column is padded to
    its width; cells may be empty or hold a space). Lines after the table are left out."""
    lines = text.splitlines()
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    out = []
    for line in lines[1:]:
        if not line.strip() or line.startswith(("No GPU", "node ", "pod ")) or "waiting" in line:
            continue
        cuts = [*starts[1:], None]
        out.append({n: line[a:b].strip() for n, a, b in zip(names, starts, cuts, strict=True)})
    return out


def test_top_shows_a_row_per_holder_and_one_for_a_free_card(placed: FakeKube) -> None:
    out = _run("top")
    rows = _rows(out)
    got = [(r["NODE"], r["CARD"], r["POD"], r["SLICE"]) for r in rows]
    assert got == [
        ("a1", "0", "team-a/train", "12000Mi 30%"),
        ("a1", "0", "team-b/infer", "4000Mi 10%"),
        ("a1", "1", "<free>", ""),
        ("t1", "0", "team-a/whole", "whole"),
    ]
    assert rows[0]["MEMORY"] == "16000/40960Mi" and rows[0]["COMPUTE"] == "40%"
    assert (rows[0]["MODEL"], rows[0]["CONTAINER"]) == ("A100", "main")
    assert all(line == line.rstrip() for line in out.splitlines())  # kubectl's: none trails
    assert "1 GPU pod(s) waiting (kubectl tessera why NAME -n NS)" in out


def test_top_by_namespace_shows_its_holders_only_and_counts_its_waiting(placed: FakeKube) -> None:
    rows = _rows(_run("top", "-n", "team-b"))
    assert [(r["NODE"], r["CARD"], r["POD"]) for r in rows] == [("a1", "0", "team-b/infer")]
    assert rows[0]["MEMORY"] == "16000/40960Mi"  # the card's whole allocation, still
    assert "1 GPU pod(s) waiting" in _run("top", "-n", "team-b")
    out = _run("top", "-n", "team-a")
    assert "waiting" not in out
    assert _run("top", "-n", "nobody").strip() == "No GPU cards found held in namespace nobody"


def test_top_by_model_and_each_order(placed: FakeKube) -> None:
    assert {r["NODE"] for r in _rows(_run("top", "--model", "T4"))} == {"t1"}
    assert _run("top", "--model", "H100").startswith("No GPU cards found\n")

    def cards(order: str) -> list[tuple[str, str]]:
        doc = json.loads(_run("top", "--sort-by", order, "-o", "json"))
        return [(c["node"], c["index"]) for c in doc["cards"]]

    assert cards("node") == [("a1", 0), ("a1", 1), ("t1", 0)]
    # Free memory: a1/1 40960, a1/0 24960, t1/0 none (held whole).
    assert cards("free") == [("a1", 1), ("a1", 0), ("t1", 0)]
    assert cards("memory") == [("a1", 0), ("t1", 0), ("a1", 1)]  # 16000, 15360 (whole), 0
    assert cards("cores") == [("t1", 0), ("a1", 0), ("a1", 1)]  # 100 %, 40 %, 0
    assert cards("used") == cards("node")  # no use known (no --prometheus): every card 0


def test_top_wide_says_each_cards_state_slots_and_policy(placed: FakeKube) -> None:
    rows = _rows(_run("top", "-o", "wide"))
    got = [(r["NODE"], r["CARD"], r["UUID"], r["STATE"], r["SLOTS"], r["POLICY"]) for r in rows]
    assert got == [
        ("a1", "0", A0, "ok", "2/16", "fixed-share"),
        ("a1", "0", A0, "ok", "2/16", "burst-share"),
        ("a1", "1", A1, "UNHEALTHY", "0/16", ""),
        ("t1", "0", T0, "cordoned", "1/16", "fixed-share"),
    ]


def test_a_sick_card_cordoned_says_both(placed: FakeKube) -> None:
    _run("cordon", "a1", "1")
    [row] = [r for r in _rows(_run("top", "-o", "wide", "--model", "A100")) if r["CARD"] == "1"]
    assert row["STATE"] == "UNHEALTHY,cordoned"


def test_top_with_prometheus_shows_and_sorts_by_live_use(
    placed: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    use = {("team-a", "train", "main", A0): (3 * 2**30, 25.0),
           ("team-a", "whole", "main", T0): (2**30, None)}  # fmt: skip
    seen: list[str] = []
    monkeypatch.setattr(prom, "container_use", lambda url: seen.append(url) or use)
    out = _run("top", "--prometheus", "http://prom:9090")
    assert seen == ["http://prom:9090"]
    rows = {r["POD"]: r for r in _rows(out)}
    assert (rows["team-a/train"]["USED"], rows["team-a/train"]["ACHIEVED"]) == ("3072Mi", "25%")
    assert (rows["team-b/infer"]["USED"], rows["team-b/infer"]["ACHIEVED"]) == ("-", "-")
    assert (rows["team-a/whole"]["USED"], rows["team-a/whole"]["ACHIEVED"]) == ("1024Mi", "-")
    doc = json.loads(_run("top", "--prometheus", "u", "--sort-by", "used", "-o", "json"))
    assert [(c["node"], c["index"]) for c in doc["cards"]] == [("a1", 0), ("t1", 0), ("a1", 1)]
    [train] = [h for h in doc["cards"][0]["holders"] if h["pod"] == "train"]
    assert (train["usedBytes"], train["achievedPercent"]) == (3 * 2**30, 25.0)


def test_top_says_when_prometheus_cannot_be_read(
    placed: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(url: str) -> Any:
        raise ConnectionRefusedError("Connection refused")

    monkeypatch.setattr(prom, "container_use", refused)
    out = _run("top", "--prometheus", "http://prom:9090", code=1)
    assert "error: --prometheus http://prom:9090: Connection refused" in out


def test_top_and_pod_name_the_problems_and_the_waiting(placed: FakeKube) -> None:
    node = placed.get(NODES, "a1")
    node["metadata"]["annotations"][INVENTORY] = "{not json"
    placed.replace(NODES, node)
    placed.merge_patch(PODS, "whole", {"metadata": {"annotations": {ASSIGNMENT: "[1"}}},
                       "team-a")  # fmt: skip
    doc = json.loads(_run("top", "-o", "json"))
    assert [c["node"] for c in doc["cards"]] == ["t1"]
    assert list(doc["nodeProblems"]) == ["a1"]
    problems = doc["podProblems"]
    assert sorted(problems) == ["team-a/train", "team-a/whole", "team-b/infer"], problems
    assert "a1" in problems["team-a/train"] and ASSIGNMENT in problems["team-a/whole"]
    assert doc["pending"] == ["team-b/waits"]
    result = CliRunner().invoke(kubectl.app, ["top"])
    assert result.exit_code == 0, result.output
    assert "node a1: " in result.stderr and "pod team-a/whole: " in result.stderr
    assert "node a1: " not in result.stdout and "pod team-a/" not in result.stdout
    out = _run("pod", "whole", code=1)
    assert out.startswith("pod team-a/whole: ")


def test_a_gpu_pod_bound_by_someone_else_is_a_problem_not_a_pod_without_gpus(
    placed: FakeKube,
) -> None:
    stray = pod_obj("stray", gpu=1, memory=1000, ns="team-a")  # no webhook here: taken as is
    stray["spec"]["nodeName"] = "a1"
    placed.create(PODS, stray, "team-a")
    told = "bound to a1 without a tessera.io/assignment annotation: its cards are not known"
    assert _run("pod", "stray", code=1) == f"pod team-a/stray: {told}\n"
    assert json.loads(_run("top", "-o", "json"))["podProblems"] == {"team-a/stray": told}
    assert json.loads(_run("pod", "stray", "-o", "json"))["problem"] == told


def test_pod_shows_its_cards_or_why_it_has_none(placed: FakeKube) -> None:
    out = _run("pod", "infer", "-n", "team-b")
    assert out.startswith("pod team-b/infer on node a1\n")
    [row] = _rows(out.split("\n", 1)[1])
    assert (row["CONTAINER"], row["CARD"], row["MODEL"], row["MEMORY"], row["COMPUTE"],
            row["POLICY"], row["UUID"]) == ("main", "0", "A100", "4000Mi", "10%", "burst-share",
                                            A0)  # fmt: skip
    doc = json.loads(_run("pod", "whole", "-o", "json"))  # the context's namespace
    assert doc["pod"] == "team-a/whole" and doc["node"] == "t1" and doc["waiting"] is None
    [card] = doc["cards"]
    assert (card["exclusive"], card["model"], card["uuid"]) == (True, "T4", T0)
    out = _run("pod", "waits", "-n", "team-b")
    assert out.startswith("pod team-b/waits is waiting to be placed (")
    assert "kubectl tessera why waits -n team-b" in out
    assert "waiting" in json.loads(_run("pod", "waits", "-n", "team-b", "-o", "json"))
    out = _run("pod", "nope", "-n", "team-b", code=1)
    assert 'pods "nope" not found in namespace team-b' in out


def test_pod_with_prometheus_shows_each_cards_live_use(
    placed: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    use = {("team-b", "infer", "main", A0): (512 * 2**20, 9.5)}
    monkeypatch.setattr(prom, "container_use", lambda url: use)
    out = _run("pod", "infer", "-n", "team-b", "--prometheus", "http://prom:9090")
    [row] = _rows(out.split("\n", 1)[1])
    assert (row["MEMORY"], row["USED"], row["ACHIEVED"]) == ("4000Mi", "512Mi", "10%")
    doc = json.loads(_run("pod", "whole", "--prometheus", "u", "-o", "json"))
    assert (doc["cards"][0]["usedBytes"], doc["cards"][0]["achievedPercent"]) == (None, None)


def test_pod_json_and_yaml_carry_every_field_sorted(placed: FakeKube) -> None:
    out = _run("pod", "infer", "-n", "team-b", "-o", "json")
    doc = json.loads(out)
    assert doc == {
        "pod": "team-b/infer", "node": "a1", "problem": None, "waiting": None,
        "cards": [{"container": "main", "init": False, "card": 0, "model": "A100", "uuid": A0,
                   "memoryMiB": 4000, "coresPercent": 10, "policy": "burst-share",
                   "exclusive": False, "usedBytes": None, "achievedPercent": None}],
    }  # fmt: skip
    # kubectl's look: two-space indents, keys sorted; YAML the same document.
    assert out == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    yml = _run("pod", "infer", "-n", "team-b", "-o", "yaml")
    assert yml == yaml.safe_dump(doc, sort_keys=True)
    assert yml.startswith("cards:\n- achievedPercent: null\n")
    top = _run("top", "-o", "yaml")
    assert yaml.safe_load(top) == json.loads(_run("top", "-o", "json"))
    assert list(yaml.safe_load(top)) == [
        "cards", "claimProblems", "nodeProblems", "pending", "podProblems"
    ]  # fmt: skip
    problem = json.loads(_run("pod", "waits", "-n", "team-b", "-o", "json"))
    assert problem["problem"] is None and problem["cards"] == []
    assert problem["waiting"] == "main: 1 card 8000 MiB 0%"


def test_pod_table_says_whole_for_a_card_held_whole_and_marks_init_containers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World([node_obj("a1", 2, "A100")])
    obj = pod_obj("prep", gpu=1, memory=2000, cores=20)
    obj["spec"]["initContainers"] = [
        {"name": "fetch", "image": "x", "resources": {"limits": {"tessera.io/gpu": "1"}}}
    ]
    assert w.schedule(w.create(obj)) == "a1"
    w.app.stop()
    monkeypatch.setattr(common.Conn, "client", lambda self: w.kube)
    try:
        rows = _rows(_run("pod", "prep", "-n", "default").split("\n", 1)[1])
        got = [(r["CONTAINER"], r["MEMORY"], r["COMPUTE"]) for r in rows]
        assert got == [("fetch (init)", "whole", "100%"), ("main", "2000Mi", "20%")]
        cards = json.loads(_run("pod", "prep", "-n", "default", "-o", "json"))["cards"]
        assert [(c["container"], c["init"], c["exclusive"]) for c in cards] == [
            ("fetch", True, True), ("main", False, False)
        ]  # fmt: skip
    finally:
        w.kube.close()


def test_pod_that_asks_no_gpu_holds_none(placed: FakeKube) -> None:
    placed.create(PODS, pod_obj("web", gpu=None, ns="team-a"), "team-a")
    assert _run("pod", "web") == "pod team-a/web holds no Tessera GPU\n"


def test_top_shows_a_claims_holders_by_their_pods_and_their_live_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim's row names the pods it is reserved for (none yet: ``<none>``) and
    ``claim/NAME`` as its container; the exporter's series for a claim carry no pod."""
    kube = FakeKube()
    kube.create(RESOURCE_SLICES, a_slice("c1", "A100"))
    held = claim("x", memory="8Gi")
    held["status"]["reservedFor"] = [{"resource": "pods", "name": "job-0", "uid": "u1"}]
    kube.seed(RESOURCE_CLAIMS, held, "team-a")
    kube.seed(RESOURCE_CLAIMS, claim("spare", memory="4Gi", device="gpu-1"), "team-a")
    c0, c1 = (c.uuid for c in make_cards("c1", 2, "A100"))
    use = {("team-a", "", "claim/x", c0): (2**30, 40.0),
           ("team-a", "job-0", "claim/x", c0): (9 * 2**30, 90.0)}  # fmt: skip
    monkeypatch.setattr(prom, "container_use", lambda url: use)
    monkeypatch.setattr(common.Conn, "client", lambda self: kube)
    rows = _rows(_run("top", "--prometheus", "u"))
    got = [(r["CARD"], r["POD"], r["CONTAINER"], r["SLICE"], r["USED"], r["ACHIEVED"])
           for r in rows]  # fmt: skip
    assert got == [
        ("0", "team-a/job-0", "claim/x", "8192Mi 10%", "1024Mi", "40%"),
        ("1", "team-a/<none>", "claim/spare", "4096Mi 10%", "-", "-"),
        ("2", "<free>", "", "", "", ""),
        ("3", "<free>", "", "", "", ""),
    ]
    doc = json.loads(_run("top", "--prometheus", "u", "-o", "json"))
    [x] = doc["cards"][0]["holders"]
    assert (x["claim"], x["usedBytes"], x["achievedPercent"]) == ("x", 2**30, 40.0)
    assert doc["cards"][0]["uuid"] == c0 and doc["cards"][1]["uuid"] == c1


def test_the_claims_path_unreadable_is_a_note_and_other_failures_are_not_hidden(
    placed: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    placed.create(RESOURCE_SLICES, a_slice("c1", "A100"))
    placed.unserved.add(RESOURCE_SLICES.plural)  # a cluster without resource.k8s.io/v1
    result = CliRunner().invoke(kubectl.app, ["top"])
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "note: cannot list resourceslices (404 NotFound): cards on the claims path are not shown\n"
    )
    assert "c1" not in result.stdout and "team-a/train" in result.stdout
    placed.unserved.add(RESOURCE_CLAIMS.plural)  # claims are not listed without slices
    result = CliRunner().invoke(kubectl.app, ["top"])
    assert result.exit_code == 0 and result.stderr.count("note: ") == 1, result.output
    placed.unserved.clear()
    listing = placed.list

    def refusing(status: int, reason: str) -> None:
        def refuse(kind: Any, *args: Any, **kw: Any) -> Any:
            if kind is RESOURCE_CLAIMS:
                raise ApiError(status, reason, "no")
            return listing(kind, *args, **kw)

        monkeypatch.setattr(placed, "list", refuse)

    refusing(403, "Forbidden")  # the role may list slices but not claims
    result = CliRunner().invoke(kubectl.app, ["top"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("note: cannot list resourceclaims (403 Forbidden)")
    assert [r["NODE"] for r in _rows(result.stdout)].count("c1") == 4  # slices still shown
    refusing(500, "InternalError")
    result = CliRunner().invoke(kubectl.app, ["top"])
    assert isinstance(result.exception, ApiError) and result.exception.status == 500


# --- quota -----------------------------------------------------------------------------


def test_capacity_sums_each_model_and_all(placed: FakeKube) -> None:
    """A100: card 0 holds 12000 + 4000 MiB and 30 + 10 % of 2 x 40960 MiB; card 1 is sick.
    T4: its one 15360 MiB card held whole, and cordoned. No card is free anywhere."""
    head = ("NODES", "CARDS", "UNHEALTHY", "CORDONED", "FREE", "MOST-FREE", "NODES-FREE-1/2/4/8")
    table = {r["MODEL"]: tuple(r[h] for h in (*head, "MEMORY", "COMPUTE"))
             for r in _rows(_run("capacity"))}  # fmt: skip
    assert table == {
        "A100": ("1", "2", "1", "0", "0", "0", "0/0/0/0", "15/80Gi 20%", "20%"),
        "T4": ("1", "1", "0", "1", "0", "0", "0/0/0/0", "15/15Gi 100%", "100%"),
        "all": ("2", "3", "1", "1", "0", "0", "0/0/0/0", "30/95Gi 32%", "47%"),
    }
    assert [r["MODEL"] for r in _rows(_run("capacity", "--model", "A100"))] == ["A100", "all"]
    doc = json.loads(_run("capacity", "-o", "json"))
    assert [(m["model"], m["allocatedMiB"]) for m in doc["models"]] == [
        ("A100", 16000),
        ("T4", 15360),
        ("all", 31360),
    ]


def test_cordon_and_uncordon_say_what_changed_and_who_keeps_running(placed: FakeKube) -> None:
    """t1's card was cordoned by the fixture; a1's two cards are not."""
    assert _run("cordon", "t1", "0") == (
        f"node t1: card 0 ({T0}) already cordoned\n"
        "  card 0: 1 tenant(s) keep running: team-a/whole\n"
    )
    assert _run("cordon", "a1", "0", "1") == (
        f"node a1: card 0 ({A0}), card 1 ({A1}) cordoned\n"
        "  card 0: 2 tenant(s) keep running: team-a/train, team-b/infer\n"
        "  card 1: no tenants\n"
    )
    assert _run("uncordon", "t1", "0") == f"node t1: card 0 ({T0}) uncordoned\n"
    assert _run("uncordon", "t1", "0") == f"node t1: card 0 ({T0}) already uncordoned\n"


@pytest.fixture
def quotas(placed: FakeKube) -> FakeKube:
    """team-a: 50000 MiB and 100 % of A100s, and one T4 card; team-b: a quota
    that does not read (a limit capping nothing)."""
    placed.create(GPUQUOTAS, gpu_quota("team-a",
        {"name": "a100", "models": ["A100"], "memoryMiB": 50000, "coresPercent": 100},
        {"name": "t4", "models": ["T4"], "cards": 1}), "team-a")  # fmt: skip
    placed.create(GPUQUOTAS, gpu_quota("team-b", {"name": "none", "models": ["*"]}), "team-b")
    return placed


def test_quota_shows_the_namespaces_use_against_each_limit(quotas: FakeKube) -> None:
    rows = _rows(_run("quota"))  # the context's namespace
    got = [(r["NAMESPACE"], r["LIMIT"], r["MODELS"], r["MEMORY"], r["CORES"], r["CARDS"])
           for r in rows]  # fmt: skip
    assert got == [
        ("team-a", "a100", "A100", "12000/50000Mi", "30/100%", "-"),
        ("team-a", "t4", "T4", "-", "-", "1/1"),
    ]
    wide = _rows(_run("quota", "-o", "wide", "-n", "team-a"))
    assert [r["HOLDERS"] for r in wide] == ["train", "whole"]
    doc = json.loads(_run("quota", "-o", "json"))
    [a100, t4] = doc["quotas"]
    assert a100["memoryMiB"] == {"used": 12000, "hard": 50000}
    assert a100["cards"] == {"used": 0, "hard": None} and a100["holders"] == ["team-a/train"]
    assert t4["cards"] == {"used": 1, "hard": 1} and t4["holders"] == ["team-a/whole"]


def test_quota_of_every_namespace_shows_one_that_does_not_read(quotas: FakeKube) -> None:
    rows = _rows(_run("quota", "-A"))
    assert [(r["NAMESPACE"], r["LIMIT"]) for r in rows] == [
        ("team-a", "a100"), ("team-a", "t4"), ("team-b", "INVALID")
    ]  # fmt: skip
    assert "spec.limits[0]" in rows[2]["MODELS"] and "must cap at least one" in rows[2]["MODELS"]
    [bad] = json.loads(_run("quota", "-n", "team-b", "-o", "json"))["quotas"]
    assert bad["quota"] == "gpus" and "must cap at least one" in bad["error"]


def test_quota_counts_the_namespaces_claims_and_notes_one_that_does_not_read(
    quotas: FakeKube,
) -> None:
    # Read past another driver's slice and a broken one of Tessera's, listed first.
    nic = {"metadata": {"name": "a-nic"}, "spec": {"driver": "nic.example.com"}}
    quotas.create(RESOURCE_SLICES, nic)
    quotas.create(RESOURCE_SLICES, {"metadata": {"name": "b-broken"}, "spec": {"driver": DRIVER}})
    quotas.create(RESOURCE_SLICES, a_slice("c1", "A100"))
    quotas.seed(RESOURCE_CLAIMS, claim("x", memory="8Gi"), "team-a")
    quotas.seed(RESOURCE_CLAIMS, claim("odd", device="gpu-9"), "team-a")  # no such device
    quotas.seed(RESOURCE_CLAIMS, claim("theirs", ns="team-b"), "team-b")
    result = CliRunner().invoke(kubectl.app, ["quota", "-o", "json"])
    assert result.exit_code == 0, result.output
    [a100, _] = json.loads(result.stdout)["quotas"]
    assert a100["memoryMiB"] == {"used": 12000 + 8192, "hard": 50000}
    assert a100["coresPercent"] == {"used": 30 + 10, "hard": 100}
    assert a100["holders"] == ["team-a/claim/x", "team-a/train"]
    assert result.stderr.startswith("note: claim team-a/odd is not counted: ")
    assert "theirs" not in result.stderr
    wide = CliRunner().invoke(kubectl.app, ["quota", "-o", "wide"])
    assert _rows(wide.stdout)[0]["HOLDERS"] == "claim/x,train"
    top = CliRunner().invoke(kubectl.app, ["top"])
    assert "team-a/odd" in top.stderr and "odd" not in top.stdout, top.output


def test_quota_where_there_is_none_or_the_resource_is_not_installed(placed: FakeKube) -> None:
    assert _run("quota", "-n", "team-c").strip() == "No GpuQuotas found in namespace team-c"
    assert _run("quota", "-A").strip() == "No GpuQuotas found"
    placed.unserved.add(GPUQUOTAS.plural)
    out = _run("quota", code=1)
    assert "error: the GpuQuota resource is not installed (deploy/gpuquota-crd.yaml)" in out
