"""``tessera dev-cluster up|status|down``: a local control plane with kwok GPU nodes."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="A real Kubernetes control plane on 127.0.0.1 with fake (kwok) GPU nodes.",
    no_args_is_help=True,
)

StateDir = Annotated[
    Path | None,
    typer.Option(
        "--state-dir",
        help="Where the cluster keeps its files [default: $XDG_STATE_HOME/tessera/dev-cluster]",
    ),
]


def default_state_dir() -> Path:
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "tessera" / "dev-cluster"


def _err(msg: str) -> None:
    typer.echo(msg, err=True)


@app.command()
def up(
    cluster: Annotated[
        Path | None,
        typer.Option(
            "--cluster", help="Node-list CSV (sn,cpu_milli,memory_mib,gpu,model), e.g. openb's"
        ),
    ] = None,
    nodes: Annotated[int, typer.Option("--nodes", help="Synthetic cluster: number of nodes")] = 4,
    cards_per_node: Annotated[
        int, typer.Option("--cards-per-node", help="Synthetic: cards per node")
    ] = 8,
    model: Annotated[
        str, typer.Option("--model", help="Synthetic: card model (e.g. A100, T4)")
    ] = "A100",
    scheduler_config: Annotated[
        Path | None,
        typer.Option(
            "--scheduler-config", help="KubeSchedulerConfiguration YAML (e.g. naming an extender)"
        ),
    ] = None,
    real_node: Annotated[
        bool,
        typer.Option(
            "--real-node",
            help="Also start a real node, 'localhost': kubelet + containerd (root; "
            "apt-get install containerd runc containernetworking-plugins)",
        ),
    ] = False,
    state_dir: StateDir = None,
) -> None:
    """Start the control plane, create the GPU nodes, print the kubeconfig path."""
    from tessera.errors import TesseraError
    from tessera.model.clusterspec import read_nodes_csv, synthetic_nodes
    from tessera.testenv.env import TestEnv

    directory = state_dir or default_state_dir()
    try:
        inventories = (
            read_nodes_csv(cluster) if cluster else synthetic_nodes(nodes, cards_per_node, model)
        )
    except (OSError, TesseraError) as exc:
        _err(f"error: cluster spec: {exc}")
        raise typer.Exit(2) from None
    try:
        env = TestEnv.start(directory, scheduler_config=scheduler_config, tied=False, progress=_err)
    except TesseraError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(1) from None
    try:
        t0 = time.monotonic()
        created = env.create_gpu_nodes(inventories, timeout=max(120.0, len(inventories) * 0.5))
        cards = sum(len(n.cards) for n in inventories)
        _err(f"{len(created)} nodes ({cards} GPUs) Ready in {time.monotonic() - t0:.1f} s")
    except BaseException as exc:
        env.stop()
        if isinstance(exc, TesseraError):
            _err(f"error: {exc}")
            raise typer.Exit(1) from None
        raise
    if real_node:
        from tessera.testenv.realnode import RealNode

        try:
            t0 = time.monotonic()
            node = RealNode.start(env, directory / "real-node", tied=False)
        except BaseException as exc:
            env.stop()
            if isinstance(exc, TesseraError):
                _err(f"error: real node: {exc}")
                raise typer.Exit(1) from None
            raise
        _err(f"real node {node.name} Ready in {time.monotonic() - t0:.1f} s")
        _err(
            "run a node agent in it:  "
            + " ".join(node.nsenter(["tessera", "node-agent", f"--node={node.name}", "..."]))
        )
    _err(f"use it:  export KUBECONFIG={env.kubeconfig}   (stop: tessera dev-cluster down)")
    typer.echo(str(env.kubeconfig))


@app.command()
def status(state_dir: StateDir = None) -> None:
    """Show whether the dev cluster's components run, and its nodes and pods."""
    from tessera.testenv.env import TestEnv
    from tessera.testenv.errors import TestEnvError

    directory = state_dir or default_state_dir()
    try:
        env = TestEnv.attach(directory)
    except TestEnvError:
        typer.echo(f"no dev cluster in {directory}")
        raise typer.Exit(1) from None
    running = env.running()
    for name, alive in running.items():
        port = env.ports.get({"kube-apiserver": "apiserver"}.get(name, name), "")
        typer.echo(f"{name:<25} {'running' if alive else 'STOPPED':<8} {LOOPBACK}:{port}")
    typer.echo(f"kubeconfig: {env.kubeconfig}")
    if not running.get("kube-apiserver"):
        raise typer.Exit(1)
    from kubernetes import client

    api: Any = env.api_client()  # the client is only partly typed
    try:
        core: Any = client.CoreV1Api(api)
        count, ready = env.ready_nodes(core, label_selector="")
        resp = core.list_pod_for_all_namespaces(_preload_content=False)
        phases: dict[str, int] = {}
        try:
            pods = json.loads(resp.data)["items"]
        finally:
            resp.release_conn()
        for p in pods:
            phase = p.get("status", {}).get("phase", "Unknown")
            phases[phase] = phases.get(phase, 0) + 1
        typer.echo(
            f"nodes: {count} ({len(ready)} Ready); pods: {len(pods)} "
            + " ".join(f"{k}={v}" for k, v in sorted(phases.items()))
        )
    finally:
        api.close()
    if not all(running.values()):
        raise typer.Exit(1)


@app.command()
def down(state_dir: StateDir = None) -> None:
    """Stop every component of the dev cluster and remove its state."""
    import shutil

    from tessera.testenv.env import TestEnv
    from tessera.testenv.errors import TestEnvError

    directory = state_dir or default_state_dir()
    try:
        env = TestEnv.attach(directory)
    except TestEnvError:
        typer.echo(f"no dev cluster in {directory}")
        return
    if (directory / "real-node").is_dir():
        from tessera.testenv.realnode import RealNode

        with contextlib.suppress(TestEnvError):  # none was started, or it was stopped
            RealNode.attach(env, directory / "real-node").stop()
    env.stop()
    left = env.listening_ports()
    if left:
        _err(f"error: ports still in use after stop: {left}")
        raise typer.Exit(1)
    for sub in ("etcd-data", "pki", "kubeconfigs", "kwok-home"):
        shutil.rmtree(directory / sub, ignore_errors=True)
    (directory / "kubeconfig").unlink(missing_ok=True)
    typer.echo(f"stopped; logs kept in {directory / 'logs'}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def kubectl(ctx: typer.Context, state_dir: StateDir = None) -> None:
    """Run kubectl (built from k8s.io/kubernetes on first use) against the dev cluster.

    Example: tessera dev-cluster kubectl -- get nodes -L tessera.io/gpu-model
    """
    from tessera.errors import TesseraError
    from tessera.testenv.build import ensure_binaries

    directory = state_dir or default_state_dir()
    try:
        binary = ensure_binaries(["kubectl"], progress=_err)["kubectl"]
    except TesseraError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(1) from None
    argv = [str(binary), f"--kubeconfig={directory / 'kubeconfig'}", *ctx.args]
    os.execv(argv[0], argv)


LOOPBACK = "127.0.0.1"

if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
