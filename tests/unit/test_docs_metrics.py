"""Every metric the docs, the alert rules and the dashboards name is one Tessera exports:
a doc must not name a metric that does not exist (and a rename must reach the docs)."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest

from tessera.model.clusterspec import make_cards
from tessera.node.exporter import AgentMetrics, NodeView
from tessera.node.formats.layout import Layout
from tessera.scheduler.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]
NAMED_IN = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "charts" / "tessera" / "rules").glob("*.yaml")),
    *sorted((REPO / "charts" / "tessera" / "dashboards").glob("*.json")),
]
NAME = re.compile(r"\btessera_[a-z][a-z0-9_]*")
# prometheus_client names a counter's family with its _total already, a histogram's not.
SUFFIXES = {"histogram": ("", "_bucket", "_sum", "_count")}


def exported(tmp_path: Path) -> set[str]:
    """Every series name the extender and the node agent expose, from their registries
    (families are announced even before they have a sample)."""
    view = NodeView("n1", lambda: make_cards("n1", 1, "A100"), list, lambda uuid: None,
                    dict, dict, claims=list)  # fmt: skip
    texts = [
        Metrics().exposition().decode(),
        generate_latest(AgentMetrics(view, Layout(tmp_path)).registry).decode(),
    ]
    names = set()
    for text in texts:
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                names |= {name + s for s in SUFFIXES.get(kind, ("",))}
    return names


def test_every_metric_named_in_the_docs_rules_and_dashboards_is_exported(
    tmp_path: Path,
) -> None:
    have = exported(tmp_path)
    assert "tessera_scheduler_preemption_blocked_total" in have  # the reading works
    missing = {}
    for path in NAMED_IN:
        for name in set(NAME.findall(path.read_text())):
            prefix = name.endswith("_")  # a family's prefix, as in tessera_claim_*
            if not (any(h.startswith(name) for h in have) if prefix else name in have):
                missing.setdefault(name, []).append(str(path.relative_to(REPO)))
    assert not missing, missing
