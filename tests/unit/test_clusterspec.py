from __future__ import annotations

from pathlib import Path

import pytest

from tessera.errors import SpecError
from tessera.model.clusterspec import (
    card_uuid,
    make_cards,
    parse_nodes_csv,
    read_nodes_csv,
    synthetic_nodes,
)

HEADER = "sn,cpu_milli,memory_mib,gpu,model"


def test_reads_rows_into_inventories() -> None:
    nodes = parse_nodes_csv([HEADER, "n0,64000,262144,2,P100", "n1,8000,32768,0,"])
    assert [n.name for n in nodes] == ["n0", "n1"]
    assert [c.index for c in nodes[0].cards] == [0, 1]
    assert {c.memory_mib for c in nodes[0].cards} == {16384}
    assert nodes[0].cards[0].uuid == card_uuid("n0", 0) != card_uuid("n0", 1)
    assert (nodes[0].cpu_milli, nodes[0].memory_mib) == (64000, 262144)
    assert nodes[1].cards == ()


def test_optional_columns_and_topology() -> None:
    nodes = parse_nodes_csv(
        [HEADER + ",gpu_memory_mib,nvlink", "n,1,1,8,X9,1000,pairs", "m,1,1,8,V100M32,,"]
    )
    assert {c.memory_mib for c in nodes[0].cards} == {1000}
    assert nodes[0].cards[2].nvlink_peers == (3,)
    v100 = nodes[1].cards
    assert v100[0].nvlink_peers == (1, 2, 3, 4)
    assert v100[5].nvlink_peers == (1, 4, 6, 7)
    assert [c.numa_node for c in v100] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("layout", "count", "peers"),
    [
        ("all", 3, [(1, 2), (0, 2), (0, 1)]),
        ("all", 1, [()]),
        ("pairs", 3, [(1,), (0,), ()]),  # the odd card out has no mate
        ("pairs", 2, [(1,), (0,)]),
        ("none", 4, [(), (), (), ()]),
        # Two quads, each card also joined to the one four away, where that card exists.
        ("cube-mesh", 6, [(1, 2, 3, 4), (0, 2, 3, 5), (0, 1, 3), (0, 1, 2), (0, 5), (1, 4)]),
    ],
)
def test_nvlink_layouts_join_the_cards_they_name(
    layout: str, count: int, peers: list[tuple[int, ...]]
) -> None:
    assert [c.nvlink_peers for c in make_cards("n", count, "T4", nvlink=layout)] == peers


def test_numa_halves_from_four_cards_and_unknown_models_count_no_sms() -> None:
    assert [c.numa_node for c in make_cards("n", 3, "T4")] == [0, 0, 0]
    assert [c.numa_node for c in make_cards("n", 4, "T4")] == [0, 0, 1, 1]
    assert make_cards("n", 1, "T4")[0].sm_count == 40
    assert make_cards("n", 1, "X9", memory_mib=1000)[0].sm_count == 0


def test_only_eight_v100s_are_cube_meshed_unless_told() -> None:
    assert make_cards("n", 8, "V100M16")[7].nvlink_peers == (3, 4, 5, 6)
    for model, count in [("V100M16", 4), ("A100", 8)]:
        assert {c.nvlink_peers for c in make_cards("n", count, model)} == {()}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("n,1,1,x,T4", "nodes line 2: column gpu: must be an integer (got 'x')"),
        ("n,-1,1,1,T4", "nodes line 2: column cpu_milli: must be >= 0 (got -1)"),
        ("n,1,1,1,Z80", "nodes line 2: column model: unknown GPU model"),
        (",1,1,1,T4", "nodes line 2: column sn: must not be empty"),
    ],
)
def test_bad_rows_name_line_and_column(row: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_nodes_csv([HEADER, row])
    assert str(err.value).startswith(message)


def test_missing_column_and_duplicates() -> None:
    with pytest.raises(SpecError, match="missing column"):
        parse_nodes_csv(["sn,gpu", "n,1"])
    with pytest.raises(SpecError, match="duplicate node name"):
        parse_nodes_csv([HEADER, "n,1,1,1,T4", "n,1,1,1,T4"])


def test_synthetic_nodes_are_deterministic() -> None:
    a = synthetic_nodes(3, 4, "A100")
    assert a == synthetic_nodes(3, 4, "A100")
    assert [n.name for n in a] == ["node-0000", "node-0001", "node-0002"]
    assert len({c.uuid for n in a for c in n.cards}) == 12
    # Names stay four digits wide up to 10,000 nodes, and widen to sort past it.
    assert synthetic_nodes(10_000, 0, "T4")[-1].name == "node-9999"
    wide = synthetic_nodes(10_001, 0, "T4")
    assert (wide[0].name, wide[-1].name) == ("node-00000", "node-10000")


def test_synthetic_nodes_refuse_negative_counts_and_allow_none() -> None:
    with pytest.raises(SpecError, match=r"nodes: must be >= 0 \(got -1\)"):
        synthetic_nodes(-1, 1, "T4")
    with pytest.raises(SpecError, match=r"cards-per-node: must be >= 0 \(got -1\)"):
        synthetic_nodes(1, -1, "T4")
    assert synthetic_nodes(0, 1, "T4") == []
    (bare,) = synthetic_nodes(1, 0, "T4")
    assert bare.cards == () and bare.memory_mib == 393216  # 384 GiB by default


def test_reads_the_openb_node_list(openb_dir: Path) -> None:
    nodes = read_nodes_csv(openb_dir / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213
    assert sum(len(n.cards) for n in nodes) == 6212
