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
        ("all", 6, [tuple(j for j in range(6) if j != i) for i in range(6)]),  # not a mesh
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
    assert [c.numa_node for c in make_cards("n", 5, "T4")] == [0, 0, 1, 1, 1]
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
        ("n,1,1,1,Z80", "nodes line 2: column model: unknown GPU model; give gpu_memory_mib "
         "or use one of A10, A100, A100-80G, G1, G2, G3, H100, H200, P100, T4, V100M16, "
         "V100M32 (got 'Z80')"),
        ("n,1,1,1,", "nodes line 2: column model: unknown GPU model; give gpu_memory_mib "
         "or use one of A10, A100, A100-80G, G1, G2, G3, H100, H200, P100, T4, V100M16, "
         "V100M32 (got '')"),
        (",1,1,1,T4", "nodes line 2: column sn: must not be empty"),
        ("n,1,x,1,T4", "nodes line 2: column memory_mib: must be an integer (got 'x')"),
    ],
)  # fmt: skip
def test_bad_rows_name_line_and_column(row: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_nodes_csv([HEADER, row])
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("n,1,1,2,T4,0,", "nodes line 2: column gpu_memory_mib: must be >= 1 (got 0)"),
        ("n,1,1,2,T4,x,", "nodes line 2: column gpu_memory_mib: must be an integer (got 'x')"),
        ("n,1,1,2,T4,,mesh", "nodes line 2: column nvlink: must be one of none, pairs, all, "
                             "cube-mesh (got 'mesh')"),
    ],
)  # fmt: skip
def test_bad_optional_columns_are_named_with_what_they_got(row: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_nodes_csv([HEADER + ",gpu_memory_mib,nvlink", row])
    assert str(err.value) == message


def test_the_smallest_values_each_column_takes() -> None:
    [n] = parse_nodes_csv([HEADER + ",gpu_memory_mib", "n,0,0,1,T4,1"])
    assert (n.cpu_milli, n.memory_mib, n.cards[0].memory_mib) == (0, 0, 1)


def test_a_files_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.csv"
    path.write_text(f"{HEADER}\nn,1,1,1,T4\nn,1,1,1,T4\n")
    with pytest.raises(SpecError) as err:
        read_nodes_csv(path)
    assert str(err.value) == "cluster.csv line 3: column sn: duplicate node name (got 'n')"


def test_card_uuids_are_nvidia_shaped_and_never_change() -> None:
    # A fake agent's node list must name the same cards in every release (the extender's
    # assignments and the agent's records hold them).
    assert card_uuid("node-a", 0) == "GPU-d94ff070-4afb-55b2-b9c9-e5ab604469c6"


def test_missing_column_and_duplicates() -> None:
    with pytest.raises(SpecError, match="missing column"):
        parse_nodes_csv(["sn,gpu", "n,1"])
    with pytest.raises(SpecError) as err:
        parse_nodes_csv([HEADER, "n,1,1,1,T4", "n,1,1,1,T4"])
    assert str(err.value) == "nodes line 3: column sn: duplicate node name (got 'n')"


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
    assert bare.cpu_milli == 96000  # 96 cores
    (small,) = synthetic_nodes(1, 1, "T4", cpu_milli=8000, memory_mib=1024, prefix="s")
    assert (small.name, small.cpu_milli, small.memory_mib) == ("s-0000", 8000, 1024)


def test_reads_the_openb_node_list(openb_dir: Path) -> None:
    nodes = read_nodes_csv(openb_dir / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213
    assert sum(len(n.cards) for n in nodes) == 6212
