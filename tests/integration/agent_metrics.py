"""The node agent's /metrics as a test reads it: over HTTP, parsed by Prometheus's own
text parser."""

from __future__ import annotations

from urllib.request import urlopen

from prometheus_client.parser import text_string_to_metric_families

from tessera.node.agent import Agent
from tests._http import get

__all__ = ["Samples", "one", "probe", "scrape"]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, labels) -> value


def scrape(agent: Agent) -> Samples:
    assert agent.metrics_port is not None
    with urlopen(f"http://127.0.0.1:{agent.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def one(samples: Samples, name: str, **labels: str) -> float:
    """The value of the one series of ``name`` whose labels include ``labels``."""
    hits = [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} series"
    return hits[0]


def probe(agent: Agent, path: str) -> tuple[int, str]:
    """The status and text of GET ``path`` (/healthz, /readyz) on the agent's port."""
    assert agent.metrics_port is not None
    status, _, text = get(f"http://127.0.0.1:{agent.metrics_port}{path}")
    return status, text
