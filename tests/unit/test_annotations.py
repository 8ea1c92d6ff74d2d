from __future__ import annotations

import json

import pytest

from tessera.errors import FormatError
from tessera.model import Assignment, Card, CardSlice, ComputePolicy, ContainerAssignment
from tessera.model import annotations as keys
from tessera.model.annotations import (
    decode_assignment,
    decode_inventory,
    encode_assignment,
    encode_inventory,
)

CARDS = (
    Card("GPU-a", 0, "A100", 40960, 108, 0, (1,), True),
    Card("GPU-b", 1, "A100", 40960, 108, 0, (0,), False, slots=4),
)


def test_inventory_round_trip() -> None:
    text = encode_inventory(CARDS)
    inv = decode_inventory("n1", text, 64000, 262144)
    assert inv.cards == CARDS
    assert (inv.name, inv.cpu_milli, inv.memory_mib) == ("n1", 64000, 262144)


def test_inventory_encoding_is_stable_bytes() -> None:
    assert encode_inventory(CARDS) == encode_inventory(tuple(reversed(CARDS)))
    assert encode_inventory(CARDS[:1]) == (
        '{"cards":[{"healthy":true,"index":0,"memoryMiB":40960,"model":"A100",'
        '"numa":0,"nvlink":[1],"slots":16,"smCount":108,"uuid":"GPU-a"}],"v":1}'
    )


def test_inventory_without_slots_reads_the_default() -> None:
    """A v1 inventory written before the field: 16 slots, the agent's default."""
    text = (
        '{"cards":[{"healthy":true,"index":0,"memoryMiB":40960,"model":"A100",'
        '"numa":0,"nvlink":[1],"smCount":108,"uuid":"GPU-a"}],"v":1}'
    )
    assert decode_inventory("n1", text, 1, 1).cards == (CARDS[0],)
    assert CARDS[0].slots == 16


def test_assignment_round_trip() -> None:
    a = Assignment(
        "n1",
        (
            ContainerAssignment("main", (CardSlice("GPU-a", 1024, 30),), ComputePolicy.BURST_SHARE),
            ContainerAssignment(
                "init", (CardSlice("GPU-b", 40960, 100),), exclusive=True, init=True
            ),
        ),
    )
    assert decode_assignment("ns/p", encode_assignment(a)) == a


_CARD = {"uuid": "x", "index": 0, "model": "T4", "memoryMiB": 1, "smCount": 1, "numa": 0,
         "nvlink": [], "healthy": True}  # fmt: skip


def _inventory(*cards: object) -> str:
    return json.dumps({"v": 1, "cards": list(cards)})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("not json", "not valid JSON: Expecting value: line 1 column 1 (char 0)"),
        ("[]", "must be a JSON object"),
        ('{"v":2,"cards":[]}', "unknown version 2; this Tessera reads v1"),
        ('{"v":1}', "missing field 'cards'"),
        ('{"v":1,"cards":[{"uuid":"x"}]}', "cards[0]: missing field 'index'"),
        (
            '{"v":1,"cards":[{"uuid":"x","index":0,"model":"T4","memoryMiB":0,"smCount":1,'
            '"numa":0,"nvlink":[],"healthy":true}]}',
            "cards[0]: field 'memoryMiB' must be > 0, got 0",
        ),
        (
            '{"v":1,"cards":[{"uuid":"x","index":true,"model":"T4","memoryMiB":1,"smCount":1,'
            '"numa":0,"nvlink":[],"healthy":true}]}',
            "cards[0]: field 'index' must be an integer, got True",
        ),
        (
            '{"v":1,"cards":[{"uuid":"x","index":0,"model":"T4","memoryMiB":1,"smCount":1,'
            '"numa":0,"nvlink":[],"healthy":true,"slots":0}]}',
            "cards[0]: field 'slots' must be >= 1, got 0",
        ),
        (
            '{"v":1,"cards":[{"uuid":"x","index":0,"model":"T4","memoryMiB":1,"smCount":1,'
            '"numa":0,"nvlink":[],"healthy":true,"slots":"4"}]}',
            "cards[0]: field 'slots' must be an integer, got '4'",
        ),
        (
            '{"v":1,"cards":[{"uuid":"x","index":0,"model":"T4","memoryMiB":1,"smCount":1,'
            '"numa":0,"nvlink":["1"],"healthy":true}]}',
            "cards[0]: field 'nvlink' must be a list of card indices",
        ),
        (
            '{"v":1,"cards":[{"uuid":"x","index":0,"model":"T4","memoryMiB":1,"smCount":1,'
            '"numa":0,"nvlink":[true],"healthy":true}]}',
            "cards[0]: field 'nvlink' must be a list of card indices",
        ),
        (
            '{"v":1,"cards":[{"uuid":"x","index":0,"model":"T4","memoryMiB":1,"smCount":1,'
            '"numa":-2,"nvlink":[],"healthy":true}]}',
            "cards[0]: field 'numa' must be >= -1, got -2",
        ),
        (_inventory("c"), "cards[0]: must be a JSON object"),
        (_inventory({**_CARD, "uuid": ""}), "cards[0]: field 'uuid' must not be empty"),
        (_inventory(_CARD, {**_CARD, "index": 1}), "cards[1]: duplicate uuid 'x'"),
        (_inventory(_CARD, {**_CARD, "uuid": "y"}), "cards[1]: duplicate index 0"),
        (_inventory({**_CARD, "index": -1}), "cards[0]: field 'index' must be >= 0, got -1"),
        (_inventory({**_CARD, "smCount": -1}), "cards[0]: field 'smCount' must be >= 0, got -1"),
        (_inventory({**_CARD, "model": 1}), "cards[0]: field 'model' must be a string, got 1"),
        (
            _inventory({**_CARD, "healthy": "yes"}),
            "cards[0]: field 'healthy' must be true or false, got 'yes'",
        ),
        (_inventory({**_CARD, "uuid": 1}), "cards[0]: field 'uuid' must be a string, got 1"),
        (
            _inventory({**_CARD, "memoryMiB": "1"}),
            "cards[0]: field 'memoryMiB' must be an integer, got '1'",
        ),
        (_inventory({**_CARD, "numa": "0"}), "cards[0]: field 'numa' must be an integer, got '0'"),
        (
            _inventory({**_CARD, "smCount": 1.5}),
            "cards[0]: field 'smCount' must be an integer, got 1.5",
        ),
        (_inventory({**_CARD, "nvlink": {}}), "cards[0]: field 'nvlink' must be a list, got {}"),
    ],
)
def test_inventory_refuses_malformed(text: str, fragment: str) -> None:
    with pytest.raises(FormatError) as err:
        decode_inventory("n1", text, 1, 1)
    assert str(err.value) == f"node n1: annotation tessera.io/inventory: {fragment}"


def test_inventory_takes_the_smallest_values_its_rules_allow() -> None:
    text = (
        '{"v":1,"cards":[{"uuid":"x","index":0,"model":"T4","memoryMiB":1,"smCount":0,'
        '"numa":-1,"nvlink":[],"healthy":false,"slots":1}]}'
    )
    [card] = decode_inventory("n1", text, 1, 1).cards
    assert (card.memory_mib, card.sm_count, card.numa_node, card.slots) == (1, 0, -1, 1)


def _container(**fields: object) -> str:
    container = {"name": "c", "init": False, "policy": "best-effort", "exclusive": False,
                 "cards": [], **fields}  # fmt: skip
    return json.dumps({"v": 1, "node": "n", "containers": [container]})


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"v":1,"node":"","containers":[]}', "field 'node' must not be empty"),
        (
            '{"v":1,"node":"n","containers":[{"name":"c","init":false,"policy":"turbo",'
            '"exclusive":false,"cards":[]}]}',
            "containers[0]: field 'policy' must be one of fixed-share, burst-share, "
            "best-effort, got 'turbo'",
        ),
        (
            '{"v":1,"node":"n","containers":[{"name":"c","init":false,"policy":"best-effort",'
            '"exclusive":false,"cards":[{"uuid":"u","memoryMiB":1,"cores":101}]}]}',
            "containers[0]: cards[0]: field 'cores' must be <= 100, got 101",
        ),
        ('{"v":1,"node":1,"containers":[]}', "field 'node' must be a string, got 1"),
        ('{"v":1,"node":"n","containers":["c"]}', "containers[0]: must be a JSON object"),
        ('{"v":1,"node":"n","containers":{}}', "field 'containers' must be a list, got {}"),
        (_container(cards=["u"]), "containers[0]: cards[0]: must be a JSON object"),
        (
            _container(cards=[{"uuid": "u", "memoryMiB": 1, "cores": -1}]),
            "containers[0]: cards[0]: field 'cores' must be >= 0, got -1",
        ),
        (
            _container(cards=[{"uuid": 7, "memoryMiB": 1, "cores": 1}]),
            "containers[0]: cards[0]: field 'uuid' must be a string, got 7",
        ),
        (
            '{"v":1,"node":"n","containers":[{"name":"c","init":1,"policy":"best-effort",'
            '"exclusive":false,"cards":[]}]}',
            "containers[0]: field 'init' must be true or false, got 1",
        ),
        (_container(policy=1), "containers[0]: field 'policy' must be a string, got 1"),
        (_container(cards={}), "containers[0]: field 'cards' must be a list, got {}"),
        (_container(name=2), "containers[0]: field 'name' must be a string, got 2"),
        (
            _container(exclusive="no"),
            "containers[0]: field 'exclusive' must be true or false, got 'no'",
        ),
        (
            _container(cards=[{"uuid": "u", "memoryMiB": 1, "cores": "1"}]),
            "containers[0]: cards[0]: field 'cores' must be an integer, got '1'",
        ),
        (
            _container(cards=[{"uuid": "u", "memoryMiB": -1, "cores": 1}]),
            "containers[0]: cards[0]: field 'memoryMiB' must be >= 0, got -1",
        ),
        (
            _container(cards=[{"uuid": "u", "memoryMiB": "1", "cores": 1}]),
            "containers[0]: cards[0]: field 'memoryMiB' must be an integer, got '1'",
        ),
    ],
)
def test_assignment_refuses_malformed(text: str, fragment: str) -> None:
    with pytest.raises(FormatError) as err:
        decode_assignment("ns/p", text)
    assert str(err.value) == f"pod ns/p: annotation tessera.io/assignment: {fragment}"


def test_footprint_takes_max_of_init_and_sum_of_apps() -> None:
    a = Assignment(
        "n",
        (
            ContainerAssignment("a", (CardSlice("u", 1000, 20),)),
            ContainerAssignment("b", (CardSlice("u", 2000, 30),)),
            ContainerAssignment("i", (CardSlice("u", 5000, 10),), init=True),
        ),
    )
    assert a.footprint() == {"u": (5000, 50, False)}
    assert a.slots() == {"u": 2}  # max(2 app containers, 1 init container)


def test_preempting_round_trips_with_sorted_victims() -> None:
    text = keys.encode_preempting("a1", ["ns/b", "ns/a"])
    assert text == '{"node":"a1","v":1,"victims":["ns/a","ns/b"]}'
    assert keys.decode_preempting("ns/p", text) == keys.Preempting(
        "a1", frozenset({"ns/a", "ns/b"})
    )


def test_preempting_carries_where_the_pod_is_to_go() -> None:
    placement = Assignment(
        "a1", (ContainerAssignment("main", (CardSlice("GPU-1", 40960, 100),), exclusive=True),)
    )
    text = keys.encode_preempting("a1", ["ns/a"], placement)
    assert text == (
        '{"node":"a1","placement":{"containers":[{"cards":[{"cores":100,"memoryMiB":40960,'
        '"uuid":"GPU-1"}],"exclusive":true,"init":false,"name":"main","policy":"fixed-share"}],'
        '"node":"a1","v":1},"v":1,"victims":["ns/a"]}'
    )
    assert keys.decode_preempting("ns/p", text) == keys.Preempting(
        "a1", frozenset({"ns/a"}), placement
    )


_PLACED = '"containers":[],"node":"a1"'


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '{"node":"a1","placement":[],"v":1,"victims":["ns/a"]}',
            "field 'placement' must be an object, got []",
        ),
        (
            '{"node":"a1","placement":{' + _PLACED + ',"v":2},"v":1,"victims":["ns/a"]}',
            "placement: unknown version 2",
        ),
        (
            '{"node":"a1","placement":{"containers":[],"node":"b2","v":1},"v":1,"victims":["ns/a"]}',
            "placement: node 'b2' is not the field 'node' 'a1'",
        ),
        (
            '{"node":"a1","placement":{"node":"a1","v":1},"v":1,"victims":["ns/a"]}',
            "placement: missing field 'containers'",
        ),
        ('{"v":1,"victims":["ns/a"]}', "missing field 'node'"),
        ('{"node":"","v":1,"victims":["ns/a"]}', "field 'node' must not be empty"),
        ('{"node":"a1","v":1,"victims":[]}', "field 'victims' must list pods as namespace/name"),
        ('{"node":"a1","v":1,"victims":["a"]}', "field 'victims' must list pods as namespace/name"),
        (
            '{"node":"a1","v":1,"victims":["ns/a","b"]}',
            "field 'victims' must list pods as namespace/name",
        ),
        ('{"node":"a1","v":2,"victims":["ns/a"]}', "unknown version 2; this Tessera reads v1"),
        ('{"node":"a1","v":1,"victims":"ns/a"}', "field 'victims' must be a list, got 'ns/a'"),
        ("[]", "must be a JSON object"),
    ],
)
def test_a_malformed_preempting_names_the_pod_the_annotation_and_the_rule(
    text: str, problem: str
) -> None:
    with pytest.raises(FormatError) as err:
        keys.decode_preempting("ns/p", text)
    assert str(err.value) == f"pod ns/p: annotation tessera.io/preempting: {problem}"
