"""``tessera scheduler``: run the extender + webhook process until SIGTERM/SIGINT."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tessera.exits import exit_with_error

if TYPE_CHECKING:
    from tessera.scheduler.config import SchedulerConfig
    from tessera.scheduler.tls import ReloadingContext

__all__ = ["scheduler"]


def scheduler(
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubeconfig; default: in-cluster, then ~/.kube/config")
    ] = None,
    scheduler_name: Annotated[
        str, typer.Option(help="kube-scheduler profile GPU pods go to")
    ] = "tessera-scheduler",
    policy: Annotated[
        str, typer.Option(help="default placement policy (NODE or NODE/CARD)")
    ] = "binpack",
    seed: Annotated[int, typer.Option(help="seed of the random policy")] = 0,
    scored: Annotated[
        bool, typer.Option(help="filter returns every feasible node; prioritize ranks")
    ] = False,
    compat: Annotated[str, typer.Option(help="comma list: hami, gpu-manager")] = "",
    host: Annotated[
        str, typer.Option(help="address of the extender (HTTP) and webhook (HTTPS)")
    ] = "0.0.0.0",
    port: Annotated[
        int,
        typer.Option(min=1, max=65535, help="extender, healthz, readyz, metrics (plain HTTP)"),
    ] = 8888,
    webhook_port: Annotated[
        int, typer.Option(min=0, max=65535, help="admission webhook (HTTPS); 0: no webhook")
    ] = 8443,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="webhook serving certificate (PEM); read again when it changes"),
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="its key (PEM)")] = None,
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            help="generate a certificate here when none is given (default: a temporary "
            "folder, removed when the process stops)"
        ),
    ] = None,
    tls_host: Annotated[
        list[str] | None, typer.Option(help="SANs of a generated cert (repeat)")
    ] = None,
    leader_elect: Annotated[
        bool, typer.Option(help="elect a leader on a Lease (run 2 replicas)")
    ] = True,
    lease_namespace: Annotated[str, typer.Option()] = "kube-system",
    lease_name: Annotated[str, typer.Option()] = "tessera-scheduler",
    reservation_ttl: Annotated[
        float, typer.Option(min=1.0, help="seconds a filter's reservation waits for bind")
    ] = 30.0,
    quota_status_s: Annotated[
        float,
        typer.Option(min=0.1, help="seconds between updates of the GpuQuota statuses"),
    ] = 5.0,
    web: Annotated[
        bool,
        typer.Option(
            help="serve the read-only GPU map page at /gpus (and /gpus.json) on --port; it "
            "shows every GPU pod's name and slice to whoever reaches the port"
        ),
    ] = False,
    preemption: Annotated[
        bool,
        typer.Option(
            help="evict lower-priority GPU pods (Eviction API) for a pod that finds no cards"
        ),
    ] = True,
    log_level: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Serve the kube-scheduler extender (filter/prioritize/bind) and the admission webhook."""
    import logging

    from tessera.errors import SpecError
    from tessera.model.podspec import Compat
    from tessera.placement.policies import make_policy
    from tessera.scheduler.config import SchedulerConfig

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        make_policy(policy)
    except SpecError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy") from None
    families = {p.strip() for p in compat.split(",") if p.strip()}
    unknown = families - {"hami", "gpu-manager"}
    if unknown:
        raise typer.BadParameter(
            f"unknown {sorted(unknown)}; use hami, gpu-manager", param_hint="--compat"
        )
    if (tls_cert is None) != (tls_key is None):
        raise typer.BadParameter("give both --tls-cert and --tls-key, or neither")
    config = SchedulerConfig(
        scheduler_name=scheduler_name,
        policy=policy,
        seed=seed,
        narrow=not scored,
        compat=Compat(hami="hami" in families, gpu_manager="gpu-manager" in families),
        reservation_ttl_s=reservation_ttl,
        quota_status_s=quota_status_s,
        web=web,
        preemption=preemption,
        leader_elect=leader_elect,
        lease_namespace=lease_namespace,
        lease_name=lease_name,
        freeze_heap=True,
    )
    with contextlib.ExitStack() as cleanup:
        tls = None
        if webhook_port:
            tls = _webhook_tls(tls_cert, tls_key, tls_dir, tls_host, cleanup)
        _serve(config, kubeconfig, host, port, webhook_port, tls)


def _webhook_tls(
    cert_file: Path | None,
    key_file: Path | None,
    directory: Path | None,
    hosts: list[str] | None,
    cleanup: contextlib.ExitStack,
) -> ReloadingContext:
    """The webhook's certificate, read before the API is reached: a wrong path or a key
    that does not match is told at once, by the flag's name. One generated in a folder
    made for it (no ``--tls-dir``) is removed with the process, however it stops: each
    start makes a new one."""
    import logging
    import ssl
    import tempfile

    from tessera.scheduler.tls import ReloadingContext, ServingCert, generate_serving_cert

    if cert_file is not None and key_file is not None:
        cert = ServingCert(cert_file, key_file)
    else:
        if directory is None:
            made = tempfile.TemporaryDirectory(prefix="tessera-tls-")
            directory = Path(cleanup.enter_context(made))
        cert = generate_serving_cert(directory, hosts or ["localhost", "127.0.0.1"])
        logging.getLogger("tessera.scheduler").info(
            "webhook certificate generated in %s (caBundle: ca.crt)", directory
        )
    try:
        return ReloadingContext(cert)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise typer.BadParameter(
            f"{cert.cert_file} and {cert.key_file} do not load: {exc}",
            param_hint="--tls-cert/--tls-key",
        ) from None


def _serve(
    config: SchedulerConfig,
    kubeconfig: Path | None,
    host: str,
    port: int,
    webhook_port: int,
    tls: ReloadingContext | None,
) -> None:
    """Run until SIGTERM or SIGINT."""
    import signal
    import threading

    from tessera.kube.binder import AioBinder
    from tessera.kube.client import KubeClient
    from tessera.kube.errors import KubeconfigError
    from tessera.scheduler.app import SchedulerApp
    from tessera.scheduler.http import Server

    try:
        api = KubeClient.from_kubeconfig(str(kubeconfig) if kubeconfig else None)
    except KubeconfigError as exc:
        exit_with_error("scheduler", str(exc))
    app = SchedulerApp(config, api)
    binder = AioBinder(api)  # one session per server loop (see kube/binder.py)
    # The ports are bound before anything starts: a replica that cannot serve must not
    # take the Lease (leader election starts in app.start), and a port in use is told
    # at once, in one line.
    try:
        servers = [Server(app, host, port, binder=binder)]
    except OSError as exc:
        exit_with_error("scheduler", f"--port {port}: {exc}")
    if tls is not None:
        tls.on_load(app.metrics.webhook_cert_loaded)
        try:
            servers.append(
                Server(app, host, webhook_port, tls.context, binder, recheck_tls=tls.check)
            )
        except OSError as exc:
            servers[0].stop()
            exit_with_error("scheduler", f"--webhook-port {webhook_port}: {exc}")
    app.start()
    for s in servers:
        s.start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    for s in servers:
        s.stop()
    app.stop()
