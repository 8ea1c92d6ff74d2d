"""``tessera node-agent``: a flag it cannot use is told at once, by name, before the agent
reaches the API server (the flag checks give no kubeconfig: reaching for the in-cluster config
would fail with another message); a node that cannot host it is one line, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli import app

CSV = "sn,cpu_milli,memory_mib,gpu,model\nn1,8000,65536,2,T4\n"


def _run(tmp_path: Path, *args: str) -> tuple[int, str]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(CSV)
    argv = ["node-agent", "--node", "n1", "--backend", "fake", "--nodes", str(nodes), *args]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, argv)
    return result.exit_code, " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("args", "told"),
    [
        (["--backstop", "kil"], "--backstop must be one of kill, warn, off, not 'kil'"),
        (["--isolation", "MPS"], "--isolation must be one of hook, mps, not 'MPS'"),
        (["--visibility", "nvidia"], "--visibility must be one of env, cdi, not 'nvidia'"),
        (
            ["--claims-cards", "1-2"],
            "--claims-cards: names card 2, which this node does not have (got '1-2')",
        ),
        (
            ["--claims-cards", "0,x"],
            "--claims-cards: must be all, none, or card indices and ranges such as 4-7 or "
            "0,2,4 (got '0,x')",
        ),
        (
            ["--slots-per-card", "0"],
            "'--slots-per-card': Input should be greater than or equal to 1",
        ),
    ],
)
def test_a_bad_flag_is_told_by_name(tmp_path: Path, args: list[str], told: str) -> None:
    code, err = _run(tmp_path, *args)
    assert code == 2 and told in err, err


def test_the_fake_backend_names_its_node_list_when_it_cannot_use_it(tmp_path: Path) -> None:
    code, err = _run(tmp_path, "--node", "n9")
    assert code == 2 and "--nodes: node 'n9' is not in nodes.csv (column sn)" in err, err
    code, err = _run(tmp_path, "--nodes", str(tmp_path / "missing.csv"))
    assert code == 2 and "--nodes: [Errno 2] No such file or directory" in err, err
    bad = tmp_path / "bad.csv"
    bad.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,8000,65536,x,T4\n")
    code, err = _run(tmp_path, "--nodes", str(bad))
    assert code == 2 and "--nodes: bad.csv line 2: column gpu: must be an integer" in err, err
    result = CliRunner().invoke(app, ["node-agent", "--node", "n1", "--backend", "fake"])
    assert result.exit_code == 2
    assert "--backend fake needs --nodes (a node CSV)" in " ".join(result.stderr.split())


def test_a_kubeconfig_it_cannot_read_is_one_line(tmp_path: Path) -> None:
    code, err = _run(tmp_path, "--kubeconfig", str(tmp_path / "none.yaml"))
    assert code == 1, err
    assert err.startswith(f"tessera node-agent: error: kubeconfig {tmp_path / 'none.yaml'}: ")


def test_a_node_without_nvml_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml  # nvidia-ml-py, a dependency: imported here as the agent imports it

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    result = CliRunner().invoke(app, ["node-agent", "--node", "n1"])
    assert result.exit_code == 1
    assert result.stderr == (
        "tessera node-agent: error: nvmlInit: NVML Shared Library Not Found "
        "(is the NVIDIA driver loaded?)\n"
    )
