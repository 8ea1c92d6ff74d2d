"""``tessera node-agent``: the command line of the node agent (heavy imports inside)."""

from __future__ import annotations

import enum
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from tessera.exits import exit_with_error

__all__ = ["node_agent"]


class Backend(enum.StrEnum):
    NVML = "nvml"
    FAKE = "fake"


_Choice = TypeVar("_Choice", bound=enum.StrEnum)


def _choice(flag: str, value: str, choices: type[_Choice]) -> _Choice:
    if value not in tuple(choices):
        raise typer.BadParameter(f"{flag} must be one of {', '.join(choices)}, not {value!r}")
    return choices(value)


def node_agent(
    node: Annotated[str, typer.Option(envvar="NODE_NAME", help="This node's name (downward API).")],
    backend: Annotated[Backend, typer.Option(help="Discovery: nvml, or fake (from --nodes).")] = (
        Backend.NVML
    ),
    nodes: Annotated[
        Path | None, typer.Option(help="Node CSV for the fake backend (clusterspec format).")
    ] = None,
    fault_dir: Annotated[
        Path | None, typer.Option(help="Fake backend: folder with `xid` and `probe-fail` files.")
    ] = None,
    fake_device_dir: Annotated[
        Path | None,
        typer.Option(help="Fake backend: the cards as files for libvgpu's fake driver."),
    ] = None,
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig; in-cluster config when omitted.")
    ] = None,
    resource: Annotated[str, typer.Option(help="Resource the plugin serves.")] = "tessera.io/gpu",
    plugin_dir: Annotated[Path, typer.Option()] = Path("/var/lib/kubelet/device-plugins"),
    pod_resources: Annotated[
        str, typer.Option(help="kubelet's pod-resources socket ('' to not use it).")
    ] = "/var/lib/kubelet/pod-resources/kubelet.sock",
    state_dir: Annotated[Path, typer.Option()] = Path("/var/lib/tessera"),
    slots_per_card: Annotated[int, typer.Option(min=1, max=1000)] = 16,
    isolation: Annotated[str, typer.Option(help="hook (libvgpu) or mps.")] = "hook",
    visibility: Annotated[str, typer.Option(help="env (NVIDIA_VISIBLE_DEVICES) or cdi.")] = "env",
    libvgpu: Annotated[
        Path | None, typer.Option(help="libvgpu.so to install under --state-dir/lib.")
    ] = None,
    recovery_s: Annotated[
        float, typer.Option(help="Quiet seconds after a fault before a probe may restore a card.")
    ] = 30.0,
    backstop: Annotated[
        str,
        typer.Option(
            help="Device memory past a container's cap, read from the driver: kill the "
            "offending process (and post an Event), warn (Event only), or off."
        ),
    ] = "kill",
    backstop_slack_mib: Annotated[
        int,
        typer.Option(
            min=0, help="Per process, device memory the driver counts that libvgpu does not."
        ),
    ] = 512,
    context_mib: Annotated[
        int,
        typer.Option(
            min=0,
            max=1 << 20,
            help="Device memory libvgpu charges against a container's cap for each CUDA "
            "context it creates (the driver's own per-context memory); 0 charges nothing.",
        ),
    ] = 0,
    metrics_port: Annotated[
        int,
        typer.Option(
            min=0, max=65535, help="Port of the exporter's /metrics (docs/operations.md); 0: off."
        ),
    ] = 9402,
    metrics_address: Annotated[str, typer.Option(help="Address /metrics listens on.")] = (
        "0.0.0.0"
    ),
    claims_cards: Annotated[
        str,
        typer.Option(
            help="Cards offered to DRA claims instead of the extender path: all, none, or "
            "indices such as 4,5,6,7; empty: the node's tessera.io/claims-cards label, none "
            "without it (docs/claims.md)."
        ),
    ] = "",
    dra_plugin_dir: Annotated[
        Path, typer.Option(help="kubelet's DRA plugin folder (the service socket goes under it).")
    ] = Path("/var/lib/kubelet/plugins"),
    dra_registry_dir: Annotated[
        Path, typer.Option(help="kubelet's plugin registration folder.")
    ] = Path("/var/lib/kubelet/plugins_registry"),
    cdi_dir: Annotated[
        Path, typer.Option(help="Where the container runtime reads CDI specs.")
    ] = Path("/var/run/cdi"),
    log_level: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Run the node agent: discovery, inventory, device plugin, health, cleanup."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from tessera.claims.devices import claims_pool
    from tessera.errors import SpecError
    from tessera.kube.client import KubeClient
    from tessera.kube.errors import KubeconfigError
    from tessera.kube.events import EventRecorder
    from tessera.node.agent import Agent, AgentConfig
    from tessera.node.backstop import BackstopMode
    from tessera.node.formats.layout import Layout
    from tessera.node.isolation import Isolation, MpsDaemon, Visibility
    from tessera.node.kube_source import KubeEvents, KubeNode, KubePods
    from tessera.node.kubelet.podresources import PodResourcesClient
    from tessera.node.ports import Discovery, DiscoveryError, StartError

    mode = _choice("--backstop", backstop, BackstopMode)
    iso = _choice("--isolation", isolation, Isolation)
    vis = _choice("--visibility", visibility, Visibility)
    disc: Discovery
    if backend is Backend.FAKE:
        from tessera.node.cards.fake import FakeDiscovery

        if nodes is None:
            raise typer.BadParameter("--backend fake needs --nodes (a node CSV)")
        try:
            disc = FakeDiscovery.from_csv(
                nodes, node, fault_dir=fault_dir, device_dir=fake_device_dir
            )
        except (OSError, SpecError, DiscoveryError) as exc:
            raise typer.BadParameter(f"--nodes: {exc}") from None
    try:
        if backend is Backend.NVML:
            from tessera.node.cards.nvml import NvmlDiscovery

            disc = NvmlDiscovery()
        facts = disc.facts()
    except DiscoveryError as exc:
        exit_with_error("node-agent", str(exc))
    try:  # before any API call: a typo is told at once, not after the pod list's wait
        claims_pool(claims_cards, [c.index for c in facts.cards])
    except SpecError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        api = KubeClient.from_kubeconfig(kubeconfig)
    except KubeconfigError as exc:
        exit_with_error("node-agent", str(exc))
    cards = frozenset(c.uuid for c in facts.cards)
    pods = KubePods(api, node, resource, cards)
    if not pods.start():
        typer.echo("warning: pod list not synced within 30 s; continuing", err=True)
    recorder = EventRecorder(api, "tessera-node-agent", instance=node)
    recorder.start()
    podres = PodResourcesClient(pod_resources, resource) if pod_resources else None
    cfg = AgentConfig(
        node=node,
        resource=resource,
        plugin_dir=plugin_dir,
        state_dir=state_dir,
        slots_per_card=slots_per_card,
        isolation=iso,
        visibility=vis,
        libvgpu=libvgpu,
        recovery_s=recovery_s,
        backstop=mode,
        backstop_slack_mib=backstop_slack_mib,
        context_mib=context_mib,
        metrics_port=metrics_port or None,
        metrics_address=metrics_address,
        claims_cards=claims_cards,
        dra_plugin_dir=dra_plugin_dir,
        dra_registry_dir=dra_registry_dir,
        cdi_dir=cdi_dir,
    )
    layout = Layout(state_dir)
    mps = MpsDaemon(layout.mps_pipe, layout.mps_log) if iso is Isolation.MPS else None
    agent = Agent(cfg, disc, pods, KubeEvents(recorder), KubeNode(api), podres, mps, kube=api)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        agent.start(facts)
    except SpecError as exc:
        raise typer.BadParameter(str(exc)) from None
    except (DiscoveryError, StartError) as exc:
        agent.stop()
        exit_with_error("node-agent", str(exc))
    typer.echo(f"tessera node-agent on {node} (pid {os.getpid()})", err=True)
    done.wait()
    agent.stop()
    pods.stop()
    recorder.stop()
