"""The exporter's collector on its own: bad files are marked, everything else served."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tessera.model.clusterspec import make_cards
from tessera.model.types import CardSlice, ComputePolicy, ContainerAssignment
from tessera.node.exporter import NodeCollector, NodeView, Registration
from tessera.node.formats.layout import AllocRecord, Layout
from tessera.node.formats.limits import encode_limits, limits_for
from tessera.node.formats.usage import (
    REGION_SIZE,
    CardTotals,
    CardUsage,
    ProcessUsage,
    encode_region,
)

CARDS = make_cards("n1", 2, "H100")
U0, U1 = CARDS[0].uuid, CARDS[1].uuid


def _alloc(layout: Layout, name: str, uuid: str, region: bytes | None) -> AllocRecord:
    rec = AllocRecord(name, (f"{uuid}::0",), f"uid-{name}", "team", name, "c", (uuid,), True,
                      "v1", 0.0)  # fmt: skip
    ca = ContainerAssignment("c", (CardSlice(uuid, 2000, 25),), ComputePolicy.FIXED_SHARE)
    layout.write_alloc(rec, encode_limits(limits_for(ca)))
    if region is not None:
        layout.region_path(name).write_bytes(region)
    return rec


def _scrape(collector: NodeCollector) -> list[tuple[str, dict[str, str], float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return [
        (s.name, s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]


def test_each_bad_file_is_marked_with_its_problem_and_the_rest_is_served(
    tmp_path: Path,
) -> None:
    layout = Layout(tmp_path)
    newer = bytearray(encode_region())
    newer[8] = 2  # version 2: a newer libvgpu than this agent reads
    recs = [
        _alloc(layout, "fine", U0, encode_region()),
        _alloc(layout, "newer", U0, bytes(newer)),
        _alloc(layout, "foreign", U1, b"JUNK" + bytes(REGION_SIZE)),
        _alloc(layout, "not-yet", U1, None),  # no process has started: no region yet
        _alloc(layout, "no-limits", U1, encode_region()),
    ]
    layout.limits_path("no-limits").unlink()
    view = NodeView(
        node="n1",
        cards=lambda: CARDS,
        allocations=lambda: recs,
        utilization=lambda uuid: None,
        backstop_actions=lambda: {("team/fine", "c", "killed"): 2},
        info=lambda: {"isolation": "hook"},
    )
    samples = _scrape(NodeCollector(view, layout))
    bad = {(s[1]["pod"], s[1]["file"], s[1]["problem"]) for s in samples
           if s[0] == "tessera_container_unreadable"}  # fmt: skip
    assert bad == {
        ("newer", "usage_region", "unknown_version"),
        ("foreign", "usage_region", "bad_magic"),
        ("no-limits", "limits", "missing"),
    }  # a missing region is an empty one: the container has not used CUDA yet
    assert {s[2] for s in samples if s[0] == "tessera_container_unreadable"} == {1}
    limits = {s[1]["pod"]: s[2] for s in samples if s[0] == "tessera_container_memory_limit_bytes"}
    assert limits == {p: 2000 << 20 for p in ("fine", "newer", "foreign", "not-yet")}
    allocated = {s[1]["uuid"]: s[2] for s in samples
                 if s[0] == "tessera_card_memory_allocated_bytes"}  # fmt: skip
    assert allocated == {U0: 4000 << 20, U1: 4000 << 20}
    held = {s[1]["uuid"]: s[2] for s in samples if s[0] == "tessera_card_slots_used"}
    assert held == {U0: 2, U1: 3}  # a container whose limits do not read still holds a slot
    assert not [s for s in samples if s[0] == "tessera_card_utilization_percent"]
    [action] = [s for s in samples if s[0] == "tessera_container_backstop_actions_total"]
    assert action[1] == {"node": "n1", "namespace": "team", "pod": "fine", "container": "c",
                         "action": "killed"} and action[2] == 2  # fmt: skip


def test_a_file_fixed_between_scrapes_is_no_longer_marked(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    recs = [_alloc(layout, "a", U0, b"TSVGPU\x00\x01 short")]
    view = NodeView("n1", lambda: CARDS, lambda: recs, lambda u: 50.0, dict, dict)
    collector = NodeCollector(view, layout)
    unreadable = "tessera_container_unreadable"
    assert [s[1]["problem"] for s in _scrape(collector) if s[0] == unreadable] == ["truncated"]
    layout.region_path("a").write_bytes(encode_region())
    assert [s for s in _scrape(collector) if s[0] == unreadable] == []


def test_prepared_claims_are_served_and_counted_on_their_cards(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    recs = [_alloc(layout, "pod-a", U0, encode_region())]
    claim = ContainerAssignment("claim", (CardSlice(U1, 5000, 40),), ComputePolicy.FIXED_SHARE)
    layout.write_claim("uid-1", encode_limits(limits_for(claim)), "{}")
    layout.write_claim("uid-2", "junk", "{}")  # its limits do not read: marked, slot held
    claims = [("uid-1", "team", "train-gpu", (U1,)), ("uid-2", "team", "broken", (U0,))]
    view = NodeView("n1", lambda: CARDS, lambda: recs, lambda u: None, dict, dict,
                    claims=lambda: claims)  # fmt: skip
    samples = _scrape(NodeCollector(view, layout))
    [limit] = [s for s in samples if s[0] == "tessera_claim_memory_limit_bytes"]
    assert limit[1] == {"node": "n1", "namespace": "team", "claim": "train-gpu", "uuid": U1,
                        "model": "H100"} and limit[2] == 5000 << 20  # fmt: skip
    [target] = [s[2] for s in samples if s[0] == "tessera_claim_compute_target_percent"]
    assert target == 40
    bad = {(s[1]["claim"], s[1]["file"], s[1]["problem"]) for s in samples
           if s[0] == "tessera_claim_unreadable"}  # fmt: skip
    assert bad == {("broken", "limits", "malformed")}
    allocated = {s[1]["uuid"]: s[2] for s in samples
                 if s[0] == "tessera_card_memory_allocated_bytes"}  # fmt: skip
    assert allocated == {U0: 2000 << 20, U1: 5000 << 20}
    cores = {s[1]["uuid"]: s[2] for s in samples
             if s[0] == "tessera_card_compute_allocated_percent"}  # fmt: skip
    assert cores == {U0: 25, U1: 40}
    held = {s[1]["uuid"]: s[2] for s in samples if s[0] == "tessera_card_slots_used"}
    assert held == {U0: 2, U1: 1}  # the broken claim holds its slot: its cards are known
    # Container series are unchanged by claims beside them.
    assert [s[1]["pod"] for s in samples if s[0] == "tessera_container_memory_limit_bytes"] == [
        "pod-a"
    ]


def test_every_card_and_container_series_has_its_figure(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    live = CardUsage(memory_bytes=300 << 20, launches=5, throttled_ns=10**9, refused_allocs=1,
                     busy_ns=2 * 10**9)  # fmt: skip
    gone = CardTotals(launches=3, throttled_ns=5 * 10**8, refused_allocs=2, busy_ns=10**9)
    busy_region = encode_region((ProcessUsage(0, 10, 1, (live,)),), (gone,))
    quiet_region = encode_region((ProcessUsage(0, 11, 1, (CardUsage(memory_bytes=100 << 20),)),))
    recs = [_alloc(layout, "busy", U0, busy_region), _alloc(layout, "quiet", U0, quiet_region)]
    cards = (CARDS[0], replace(CARDS[1], healthy=False))
    view = NodeView("n1", lambda: cards, lambda: recs, {U0: 37.5}.get, dict,
                    lambda: {"isolation": "hook", "library": "v1"},
                    corrections=lambda: 3,
                    registrations=lambda: {"dra": Registration(False, 2),
                                           "device-plugin": Registration(True, 0)})  # fmt: skip
    samples = _scrape(NodeCollector(view, layout))

    def card(name: str) -> dict[str, float]:
        return {s[1]["uuid"]: s[2] for s in samples if s[0] == f"tessera_card_{name}"}

    def ctr(name: str) -> dict[str, float]:
        return {s[1]["pod"]: s[2] for s in samples if s[0] == f"tessera_container_{name}"}

    total = CARDS[0].memory_mib << 20
    assert card("memory_total_bytes") == {U0: total, U1: total}
    assert card("memory_allocated_bytes") == {U0: 4000 << 20, U1: 0}
    assert card("memory_used_bytes") == {U0: 400 << 20, U1: 0}
    assert card("compute_allocated_percent") == {U0: 50, U1: 0}
    assert card("utilization_percent") == {U0: 37.5}
    assert card("healthy") == {U0: 1, U1: 0}
    assert card("slots") == {U0: CARDS[0].slots, U1: CARDS[1].slots}
    assert card("slots_used") == {U0: 2, U1: 0}
    card_series = [s for s in samples if s[0].startswith("tessera_card_")]
    assert [s[1] for s in card_series[:2]] == [  # each card's labels, in index order
        {"node": "n1", "uuid": U0, "index": "0", "model": "H100"},
        {"node": "n1", "uuid": U1, "index": "1", "model": "H100"},
    ]
    assert ctr("memory_used_bytes") == {"busy": 300 << 20, "quiet": 100 << 20}
    assert ctr("busy_seconds_total") == {"busy": 3.0, "quiet": 0}
    assert ctr("throttled_seconds_total") == {"busy": 1.5, "quiet": 0}
    assert ctr("refused_allocations_total") == {"busy": 3, "quiet": 0}
    assert ctr("launches_total") == {"busy": 8, "quiet": 0}
    assert ctr("processes") == {"busy": 1, "quiet": 1}
    [info] = [s for s in samples if s[0] == "tessera_agent_info"]
    assert info[1] == {"node": "n1", "isolation": "hook", "library": "v1"} and info[2] == 1
    [corrected] = [s for s in samples if s[0] == "tessera_agent_match_corrections_total"]
    assert corrected[1:] == ({"node": "n1"}, 3)
    for name, want in (("registered", [1, 0]), ("registration_failures_total", [0, 2])):
        got = [s[1:] for s in samples if s[0] == f"tessera_agent_{name}"]
        assert got == [({"node": "n1", "plugin": "device-plugin"}, want[0]),
                       ({"node": "n1", "plugin": "dra"}, want[1])]  # fmt: skip


def test_a_file_that_does_not_read_is_marked_each_scrape_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layout = Layout(tmp_path)
    recs = [_alloc(layout, "a", U0, b"JUNK" + bytes(REGION_SIZE)), _alloc(layout, "b", U1, None)]
    layout.region_path("b").mkdir()  # a folder where the region should be: not readable
    view = NodeView("n1", lambda: CARDS, lambda: recs, lambda u: None, dict, dict)
    collector = NodeCollector(view, layout)
    unreadable = "tessera_container_unreadable"
    with caplog.at_level(logging.WARNING, logger="tessera.node.exporter"):
        for _ in range(2):
            marked = {
                (s[1]["pod"], s[1]["problem"]) for s in _scrape(collector) if s[0] == unreadable
            }
            assert marked == {("a", "bad_magic"), ("b", "unreadable")}
        assert [r.getMessage().split(":")[1] for r in caplog.records] == [
            " team/a/c usage_region", " team/b/c usage_region"]  # fmt: skip
        gone = recs.pop()  # b goes; when it comes back, its problem is told again
        _scrape(collector)
        recs.append(gone)
        _scrape(collector)
    assert len(caplog.records) == 3 and "team/b/c" in caplog.records[2].getMessage()


def test_a_container_whose_files_do_not_read_leaves_the_others_and_its_limits_served(
    tmp_path: Path,
) -> None:
    """Its limits missing: the next container still served. Its region garbled: every
    card's limit still served. A card the node no longer shows:
    its model is left empty."""
    layout = Layout(tmp_path)
    first = _alloc(layout, "no-limits", U0, encode_region())
    layout.limits_path("no-limits").unlink()
    gone = "GPU-00000000-0000-0000-0000-0000000000ff"
    two = AllocRecord("two", (f"{U0}::1", f"{gone}::0"), "uid-two", "team", "two", "c",
                      (U0, gone), True, "v1", 0.0)  # fmt: skip
    ca = ContainerAssignment("c", (CardSlice(U0, 1000, 10), CardSlice(gone, 3000, 30)),
                             ComputePolicy.FIXED_SHARE)  # fmt: skip
    layout.write_alloc(two, encode_limits(limits_for(ca)))
    layout.region_path("two").write_bytes(b"JUNK" + bytes(REGION_SIZE))
    view = NodeView("n1", lambda: CARDS, lambda: [first, two], lambda u: None, dict, dict)
    samples = _scrape(NodeCollector(view, layout))
    limits = {(s[1]["pod"], s[1]["uuid"], s[1]["model"]): s[2] for s in samples
              if s[0] == "tessera_container_memory_limit_bytes"}  # fmt: skip
    assert limits == {("two", U0, "H100"): 1000 << 20, ("two", gone, ""): 3000 << 20}
