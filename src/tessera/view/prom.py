"""Live use per container and per claim from Prometheus (the node agents' exporter,
scraped there).

Two instant queries over Prometheus's HTTP API (``/api/v1/query``): memory in use, and
the achieved compute share as the rate of kernel time between the last two scrapes, each
for containers and claims together. Only the standard library: one GET each, JSON
answers. A claim's key has no pod and ``claim/NAME`` in the container's place.
"""

from __future__ import annotations

import json
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import urlopen

__all__ = ["ACHIEVED", "MEMORY_USED", "Sample", "container_use", "query"]

Key = tuple[str, str, str, str]  # namespace, pod, container, uuid

MEMORY_USED = "tessera_container_memory_used_bytes or tessera_claim_memory_used_bytes"
# The last two samples (irate): what the container achieves now, as ``top`` should show;
# the dashboards average over a minute instead.
ACHIEVED = (
    "irate(tessera_container_busy_seconds_total[2m]) * 100"
    " or irate(tessera_claim_busy_seconds_total[2m]) * 100"
)


Sample = tuple[dict[str, str], float]  # a series' labels and its value


def query(base_url: str, promql: str, timeout_s: float = 10.0) -> list[Sample]:
    """The result vector of an instant query, as (labels, value) pairs; OSError when
    Prometheus cannot answer, or what answers is not Prometheus."""
    url = f"{base_url.rstrip('/')}/api/v1/query?{urlencode({'query': promql})}"
    try:
        with urlopen(url, timeout=timeout_s) as r:
            status, raw = r.status, r.read()
    except HTTPError as err:  # Prometheus says why in the body (400, 422, 503)
        with err:
            status, raw = err.code, err.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise OSError(f"query {promql!r}: HTTP {status}, not an answer of Prometheus's API")
    if body.get("status") != "success":
        raise OSError(f"query {promql!r} failed: {body.get('error', body)}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise OSError(f"query {promql!r}: expected a vector, got {data.get('resultType')}")
    result = data.get("result") or []
    samples = [_sample(s) for s in result] if isinstance(result, list) else [None]
    if None in samples:
        shape = "each series its labels and a [time, value] pair"
        seen = str(result)[:300]
        raise OSError(f"query {promql!r}: a vector that is not Prometheus's ({shape}): {seen}")
    return [s for s in samples if s is not None]


def _sample(series: object) -> Sample | None:
    """One series of a vector as (labels, value); None if it is not of that shape."""
    if not isinstance(series, dict):
        return None
    labels, value = series.get("metric", {}), series.get("value")
    if not (isinstance(labels, dict) and isinstance(value, list) and len(value) == 2):
        return None
    try:
        return {str(k): str(v) for k, v in labels.items()}, float(value[1])
    except (TypeError, ValueError):
        return None


def _by_key(samples: list[Sample]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for labels, value in samples:
        ns, pod, ctr, uuid = (labels.get(k, "") for k in ("namespace", "pod", "container", "uuid"))
        if labels.get("claim"):
            ctr = f"claim/{labels['claim']}"
        out[(ns, pod, ctr, uuid)] = value
    return out


def container_use(base_url: str) -> dict[Key, tuple[float | None, float | None]]:
    """(namespace, pod, container, uuid) -> (memory used bytes, achieved percent)."""
    used = _by_key(query(base_url, MEMORY_USED))
    achieved = _by_key(query(base_url, ACHIEVED))
    return {k: (used.get(k), achieved.get(k)) for k in used.keys() | achieved.keys()}
