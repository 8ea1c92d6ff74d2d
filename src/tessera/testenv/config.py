"""Configuration files of the control plane, as plain data. Pure: nothing here does I/O.

- ``kubeconfig``: a kubeconfig for one identity (client certificate) and one server;
- ``scheduler_config``: a KubeSchedulerConfiguration with our connection and leader
  election off, merged over what the caller gives (e.g. extenders);
- ``extender``: one ``extenders[]`` entry for a scheduler extender on 127.0.0.1.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tessera.model.names import ResourceNames

__all__ = ["extender", "kubeconfig", "scheduler_config"]

SCHEDULER_API = "kubescheduler.config.k8s.io/v1"


def write_yaml(path: Path, data: Mapping[str, Any]) -> None:
    """``data`` as YAML at ``path``, readable by its owner only (configs hold key paths)."""
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    path.chmod(0o600)


def kubeconfig(
    server: str, ca: Path, cert: Path, key: Path, name: str = "tessera-testenv"
) -> dict[str, Any]:
    """A kubeconfig whose single context reaches ``server`` as the certificate's identity."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {"name": name, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "preferences": {},
    }


def scheduler_config(base: Mapping[str, Any] | None, kubeconfig_path: Path) -> dict[str, Any]:
    """``base`` (a KubeSchedulerConfiguration as a dict, may be None) completed for the env.

    The env owns the connection and leader election: ``clientConnection.kubeconfig`` is
    set to ``kubeconfig_path`` and ``leaderElection.leaderElect`` to false; the client
    limit defaults to 1000 QPS (burst 2000) unless given; everything else (profiles,
    extenders, percentageOfNodesToScore ...) is the caller's.
    """
    cfg: dict[str, Any] = copy.deepcopy(dict(base or {}))
    kind = cfg.setdefault("kind", "KubeSchedulerConfiguration")
    if kind != "KubeSchedulerConfiguration":
        raise ValueError(f"scheduler config: kind must be KubeSchedulerConfiguration, got {kind!r}")
    cfg.setdefault("apiVersion", SCHEDULER_API)
    conn = cfg.setdefault("clientConnection", {})
    conn["kubeconfig"] = str(kubeconfig_path)
    # kube-scheduler's default client limit (50 QPS) would cap binding at ~50 pods/s;
    # a test env should measure the scheduler and extender, not that limit.
    conn.setdefault("qps", 1000)
    conn.setdefault("burst", 2000)
    cfg.setdefault("leaderElection", {})["leaderElect"] = False
    return cfg


def extender(
    url: str,
    *,
    filter_verb: str | None = "filter",
    prioritize_verb: str | None = "prioritize",
    bind_verb: str | None = "bind",
    weight: int = 1,
    names: ResourceNames | None = None,
    ignored_by_scheduler: bool = True,
    node_cache_capable: bool = False,
    http_timeout: str = "5s",
    ca_file: Path | None = None,
) -> dict[str, Any]:
    """An ``extenders[]`` entry for ``url`` (e.g. ``http://127.0.0.1:PORT/tessera``).

    The Tessera resources are listed as managed, so the scheduler sends only pods that
    ask for them; with ``ignored_by_scheduler`` the scheduler leaves their fit to the
    extender. A verb set to None is not called.
    """
    names = names or ResourceNames()
    entry: dict[str, Any] = {
        "urlPrefix": url,
        "weight": weight,
        "httpTimeout": http_timeout,
        "nodeCacheCapable": node_cache_capable,
        "enableHTTPS": url.startswith("https://"),
        "managedResources": [
            {"name": r, "ignoredByScheduler": ignored_by_scheduler} for r in names.all()
        ],
    }
    for key, verb in (
        ("filterVerb", filter_verb),
        ("prioritizeVerb", prioritize_verb),
        ("bindVerb", bind_verb),
    ):
        if verb:
            entry[key] = verb
    if ca_file is not None:
        entry["tlsConfig"] = {"caFile": str(ca_file)}
    return entry
