"""What every ``kubectl tessera`` command shares: the Typer app, kubectl's options, the
connection, and the output helpers."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer

from tessera.view.gpumap import GpuMap

app = typer.Typer(
    name="kubectl tessera",
    help="Tessera's view of the cluster's GPUs: who holds which card, and why a pod waits.",
    no_args_is_help=True,
    add_completion=False,
)


class Output(enum.StrEnum):
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"


Kubeconfig = Annotated[str | None, typer.Option("--kubeconfig", help="Path of the kubeconfig.")]
Context = Annotated[str | None, typer.Option("--context", help="kubeconfig context to use.")]
Namespace = Annotated[str | None, typer.Option("--namespace", "-n", help="Namespace.")]
Out = Annotated[Output | None, typer.Option("--output", "-o", help="wide, json or yaml.")]
Prom = Annotated[
    str | None,
    typer.Option("--prometheus", help="Prometheus base URL for live use (memory, compute)."),
]


@dataclass(frozen=True, slots=True)
class Conn:
    kubeconfig: str | None
    context: str | None

    def client(self) -> Any:
        """The API client, or exit 1 saying what is wrong with the kubeconfig."""
        from tessera.kube.client import KubeClient
        from tessera.kube.errors import KubeconfigError

        try:
            return KubeClient.from_kubeconfig(self.kubeconfig, self.context, pool_size=4)
        except KubeconfigError as exc:
            fail(str(exc))

    def namespace(self, given: str | None) -> str:
        """``-n``, else the context's namespace, else ``default`` (as kubectl does)."""
        if given:
            return given
        from kubernetes import config as k8s_config

        try:
            contexts, active = k8s_config.list_kube_config_contexts(self.kubeconfig)  # type: ignore[no-untyped-call]
        except Exception:  # in-cluster, or no kubeconfig: kubectl's default
            return "default"
        chosen = next((c for c in contexts if c["name"] == self.context), active)
        return str((chosen or {}).get("context", {}).get("namespace") or "default")


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def api_failure(exc: Exception) -> str:
    """What to tell the user when a call to the API server failed (kube/errors.py)."""
    from tessera.kube.errors import Gone, Unavailable

    if isinstance(exc, Unavailable):
        return f"the API server did not answer: {exc.message}"
    if isinstance(exc, Gone):
        return (f"a list expired before it was read to the end, twice, the API server "
                f"having compacted its version ({exc}); run the command again")  # fmt: skip
    return f"the API server refused: {exc}"


def get_pod(api: Any, name: str, namespace: str) -> dict[str, Any]:
    """The pod, or exit 1 with kubectl's wording when it does not exist."""
    from tessera.kube.errors import NotFound
    from tessera.kube.kinds import PODS

    try:
        return dict(api.get(PODS, name, namespace))
    except NotFound:
        fail(f'pods "{name}" not found in namespace {namespace}')


def load_map(
    api: Any,
    path: tuple[list[Any], list[Any]] | None = None,
    nodes: list[Any] | None = None,
) -> GpuMap:
    """The map as listed now; ``path``: the claims path already listed (``claims_path``),
    ``nodes``: the nodes already listed."""
    from tessera.kube.kinds import NODES, PODS
    from tessera.kube.reflector import listed
    from tessera.view.gpumap import build_map

    slices, claims = path if path is not None else claims_path(api)
    if nodes is None:
        nodes = api.list(NODES).items
    # The pods a page at a time: 200,000 of them decoded at once are gigabytes.
    return build_map(nodes, listed(api, PODS), slices=slices, claims=claims)


def claims_path(api: Any) -> tuple[list[Any], list[Any]]:
    """Every ResourceSlice and ResourceClaim (the claims path), as listed now."""
    from tessera.kube.errors import ApiError
    from tessera.kube.kinds import RESOURCE_CLAIMS, RESOURCE_SLICES

    def listed(kind: Any) -> list[Any]:
        """The claims path's objects; none where the cluster has no resource.k8s.io/v1
        (404) or the role may not list them (403), said once on stderr."""
        try:
            return list(api.list(kind).items)
        except ApiError as exc:
            if exc.status not in (403, 404):
                raise
            typer.echo(f"note: cannot list {kind.plural} ({exc.status} {exc.reason}): "
                       "cards on the claims path are not shown", err=True)  # fmt: skip
            return []

    slices = listed(RESOURCE_SLICES)
    return slices, listed(RESOURCE_CLAIMS) if slices else []


def slice_cards(slices: list[Any]) -> dict[str, dict[str, Any]]:
    """Pool -> device name -> card, from this driver's readable slices."""
    from tessera.claims.devices import DRIVER, slice_devices
    from tessera.errors import SpecError

    out: dict[str, dict[str, Any]] = {}
    for obj in slices:
        if (obj.get("spec") or {}).get("driver") != DRIVER:
            continue
        try:
            pool, cards = slice_devices(obj)
        except SpecError:
            continue  # top names it among the claim problems
        out[pool] = cards
    return out


def emit(obj: Any, output: Output) -> None:
    if output is Output.JSON:
        typer.echo(json.dumps(obj, indent=2, sort_keys=True))
    else:
        import yaml

        typer.echo(yaml.safe_dump(obj, sort_keys=True), nl=False)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """kubectl's look: upper-case headers, columns padded by three spaces."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for r in cells:
        typer.echo("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def mib(n: int) -> str:
    return f"{n}Mi"  # exact: what the pod asked for, in the unit it asked in
