"""The agent's HTTP port: /metrics, and the probes kubelet asks on the same port.

GET /healthz   200 while the agent serves (the DaemonSet's liveness probe)
GET /readyz    200 once kubelet has taken every kubelet plugin the agent serves (the
               device plugin, and the DRA driver with claims cards); 503 and the reason
               until then. A rolling update of the DaemonSet waits on it node by node.
GET other      the Prometheus exposition of the agent's registry (/metrics)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

__all__ = ["serve"]

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape is not news
        pass


def _text(start_response: StartResponse, status: str, body: str) -> Iterable[bytes]:
    data = (body + "\n").encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(data)))])  # fmt: skip
    return [data]


def serve(
    port: int, address: str, registry: CollectorRegistry, not_ready: Callable[[], str]
) -> WSGIServer:
    """Serve on a daemon thread. ``not_ready()``: why the agent is not ready, "" when it is."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            return _text(start_response, "200 OK", "ok")
        if path == "/readyz":
            why = not_ready()
            if why:
                return _text(start_response, "503 Service Unavailable", why)
            return _text(start_response, "200 OK", "ok")
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET

    httpd = make_server(address, port, app, Server, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="agent-http", daemon=True).start()
    return httpd
