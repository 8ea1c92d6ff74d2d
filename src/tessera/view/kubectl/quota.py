"""``kubectl tessera quota``: GpuQuotas and what holds them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import typer

from tessera.view.kubectl.common import (
    Conn,
    Context,
    Kubeconfig,
    Namespace,
    Out,
    Output,
    claims_path,
    emit,
    fail,
    load_map,
    print_table,
    slice_cards,
)


def quota(
    namespace: Namespace = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", "-A", help="Every namespace.")
    ] = False,
    output: Out = None,
    kubeconfig: Kubeconfig = None,
    context: Context = None,
) -> None:
    """GpuQuotas and what their namespace's pods and claims hold now, counted from the
    assignments and allocations (the same count the extender enforces; the quota's status
    is the extender's copy)."""
    from tessera.errors import SpecError
    from tessera.kube.errors import NotFound
    from tessera.kube.kinds import GPUQUOTAS
    from tessera.quota.claims import claim_holding, claim_key
    from tessera.quota.spec import parse_quota
    from tessera.quota.usage import QuotaUsage, holding

    conn = Conn(kubeconfig, context)
    api = conn.client()
    ns = None if all_namespaces else conn.namespace(namespace)
    try:
        objs = api.list(GPUQUOTAS, ns).items
    except NotFound:
        fail("the GpuQuota resource is not installed (deploy/gpuquota-crd.yaml)")
    path = claims_path(api)
    slices, claims = path
    gmap = load_map(api, path)
    model_of = {c.uuid: c.model for n in gmap.nodes for c in n.cards}
    used = QuotaUsage()
    for key, a in gmap.assignments.items():
        used.set_pod(key, key.partition("/")[0], holding(a, lambda u: model_of.get(u, "")))
    cards = slice_cards(slices)
    for c in claims:
        meta = c.get("metadata") or {}
        ns_, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        try:
            used.set_pod(claim_key(ns_, name), ns_, claim_holding(c, cards.get))
        except SpecError as exc:  # as the extender: a claim that does not read is not counted
            typer.echo(f"note: claim {ns_}/{name} is not counted: {exc}", err=True)
    out: list[dict[str, Any]] = []
    for obj in sorted(objs, key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"])):
        meta = obj["metadata"]
        try:
            q = parse_quota(obj)
        except SpecError as exc:
            out.append({"namespace": meta["namespace"], "quota": meta["name"],
                        "error": str(exc)})  # fmt: skip
            continue
        for lim in q.limits:
            u = used.of(q.namespace, lim)
            out.append({
                "namespace": q.namespace, "quota": q.name, "limit": lim.name,
                "models": sorted(lim.models),
                "memoryMiB": {"used": u.memory_mib, "hard": lim.memory_mib},
                "coresPercent": {"used": u.cores_percent, "hard": lim.cores_percent},
                "cards": {"used": u.cards, "hard": lim.cards},
                "holders": used.holders(q.namespace, lim),
            })  # fmt: skip
    if output in (Output.JSON, Output.YAML):
        emit({"quotas": out}, output)
        return
    if not out:
        typer.echo("No GpuQuotas found" + (f" in namespace {ns}" if ns else ""))
        return

    def pair(d: Mapping[str, int | None], unit: str = "") -> str:
        return "-" if d["hard"] is None else f"{d['used']}/{d['hard']}{unit}"

    headers = ["NAMESPACE", "QUOTA", "LIMIT", "MODELS", "MEMORY", "CORES", "CARDS"]
    if output is Output.WIDE:
        headers.append("HOLDERS")
    rows = []
    for r in out:
        if "error" in r:
            rows.append([r["namespace"], r["quota"], "INVALID", r["error"], "", "", ""])
            continue
        row = [r["namespace"], r["quota"], r["limit"], ",".join(r["models"]),
               pair(r["memoryMiB"], "Mi"), pair(r["coresPercent"], "%"),
               pair(r["cards"])]  # fmt: skip
        if output is Output.WIDE:
            row.append(",".join(h.partition("/")[2] for h in r["holders"]) or "-")
        rows.append(row)
    print_table(headers, rows)
