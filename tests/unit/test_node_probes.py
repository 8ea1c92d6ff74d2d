"""The agent's HTTP port: the probes kubelet asks, and /metrics beside them."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from tessera.node.probes import serve
from tests._http import get


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("tessera_test_things", "things", registry=registry).inc(3)
    return registry


@pytest.fixture(params=["127.0.0.1", "::1"])
def address(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "::1" and not _has_ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    yield request.param


def test_probes_answer_what_the_agent_says_and_metrics_are_served_beside_them(
    registry: CollectorRegistry, address: str, capsys: pytest.CaptureFixture[str]
) -> None:
    why = ["kubelet has not registered the device plugin tessera.io/gpu"]
    server = serve(0, address, registry, lambda: why[0])
    host = f"[{address}]" if ":" in address else address
    base = f"http://{host}:{server.server_port}"
    try:
        plain = "text/plain; charset=utf-8"
        assert get(f"{base}/healthz") == (200, plain, "ok\n")
        assert get(f"{base}/readyz") == (503, plain, f"{why[0]}\n")
        why[0] = ""
        assert get(f"{base}/readyz") == (200, plain, "ok\n")
        status, kind, text = get(f"{base}/metrics")
        assert status == 200 and kind.startswith("text/plain; version=0.0.4")
        assert "tessera_test_things_total 3.0" in text.splitlines()
        # A probe every few seconds and a scrape a minute are not news in the agent's log.
        assert capsys.readouterr().err == ""
    finally:
        server.shutdown()
        server.server_close()


def test_a_probe_answer_says_its_length(registry: CollectorRegistry) -> None:
    # kubelet's prober is Go's HTTP client: a Content-Length that is missing or not the
    # body's length is a failed probe there, whatever the status.
    server = serve(0, "127.0.0.1", registry, lambda: "not yet")
    try:
        for path, status in (("/healthz", 200), ("/readyz", 503)):
            conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=10)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                body = resp.read()
                assert resp.status == status
                assert resp.getheader("Content-Length") == str(len(body)) != "0"
            finally:
                conn.close()
    finally:
        server.shutdown()
        server.server_close()
