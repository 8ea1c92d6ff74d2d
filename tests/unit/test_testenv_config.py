"""Pure config builders: kubeconfig, scheduler config, extender entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.model.names import ResourceNames
from tessera.testenv.config import extender, kubeconfig, scheduler_config


def test_kubeconfig_names_server_and_cert_files() -> None:
    kc = kubeconfig("https://127.0.0.1:6443", Path("/p/ca.crt"), Path("/p/a.crt"), Path("/p/a.key"))
    assert kc["clusters"][0]["cluster"] == {
        "server": "https://127.0.0.1:6443",
        "certificate-authority": "/p/ca.crt",
    }
    assert kc["users"][0]["user"] == {"client-certificate": "/p/a.crt", "client-key": "/p/a.key"}
    assert kc["current-context"] == kc["contexts"][0]["name"]


def test_scheduler_config_forces_connection_and_no_leader_election() -> None:
    base = {"leaderElection": {"leaderElect": True}, "percentageOfNodesToScore": 10}
    cfg = scheduler_config(base, Path("/k"))
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert cfg["clientConnection"]["kubeconfig"] == "/k"
    assert cfg["leaderElection"]["leaderElect"] is False
    assert cfg["percentageOfNodesToScore"] == 10
    assert cfg["clientConnection"]["qps"] == 1000
    assert base["leaderElection"]["leaderElect"] is True  # caller's dict untouched


def test_scheduler_config_refuses_another_kind() -> None:
    with pytest.raises(ValueError, match="KubeSchedulerConfiguration"):
        scheduler_config({"kind": "Pod"}, Path("/k"))


def test_extender_entry_manages_tessera_resources() -> None:
    e = extender("http://127.0.0.1:9000/tessera", bind_verb=None)
    assert e["urlPrefix"] == "http://127.0.0.1:9000/tessera"
    assert e["filterVerb"] == "filter"
    assert e["prioritizeVerb"] == "prioritize"
    assert "bindVerb" not in e
    assert e["enableHTTPS"] is False
    managed = {r["name"] for r in e["managedResources"]}
    assert managed == set(ResourceNames().all())
    assert all(r["ignoredByScheduler"] for r in e["managedResources"])


def test_https_extender_gets_tls_config() -> None:
    e = extender("https://127.0.0.1:9443", ca_file=Path("/ca.crt"))
    assert e["enableHTTPS"] is True
    assert e["tlsConfig"] == {"caFile": "/ca.crt"}


def test_scheduler_client_limits_can_be_set_by_the_caller() -> None:
    cfg = scheduler_config({"clientConnection": {"qps": 50, "burst": 100}}, Path("/k"))
    assert cfg["clientConnection"] == {"kubeconfig": "/k", "qps": 50, "burst": 100}
