"""A generated serving certificate works: the webhook answers over TLS to a client that
trusts only the generated CA, for the names it was generated for."""

from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path

from tessera.scheduler.http import serve
from tessera.scheduler.tls import generate_serving_cert, server_context
from tests.unit._scheduler_world import World, node_obj, pod_obj


def test_webhook_over_generated_tls(tmp_path: Path) -> None:
    cert = generate_serving_cert(tmp_path / "tls", ["localhost", "127.0.0.1"])
    assert (tmp_path / "tls" / "tls.key").stat().st_mode & 0o077 == 0
    w = World([node_obj("n1", 1)])
    server = serve(w.app, "127.0.0.1", 0, server_context(cert))
    try:
        client = ssl.create_default_context(cafile=str(cert.ca_file))
        for host in ("127.0.0.1", "localhost"):
            conn = http.client.HTTPSConnection(host, server.port, context=client, timeout=10)
            review = {"request": {"uid": "1", "operation": "CREATE", "object": pod_obj("p")}}
            conn.request("POST", "/mutate", body=json.dumps(review).encode())
            resp = conn.getresponse()
            assert resp.status == 200
            assert json.loads(resp.read())["response"]["allowed"]
            conn.close()
    finally:
        server.stop()
        w.close()
