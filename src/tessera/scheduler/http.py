"""The socket side: a threaded stdlib HTTP/1.1 server that hands requests to the app.

kube-scheduler keeps its connections to the extender alive, so a thread per
connection (``ThreadingHTTPServer``) means a handful of threads, and the handlers are
short. Bodies over ``MAX_BODY`` get 413; a missing or bad Content-Length gets 411/400.
Access logs go to the ``tessera.scheduler.http`` logger at debug level.
"""

from __future__ import annotations

import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tessera.scheduler.app import Response, SchedulerApp

__all__ = ["MAX_BODY", "Server", "serve"]

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # 5,000 full Node objects fit; names-only bodies are ~100 KB


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "tessera-scheduler"
    # One send per response, sent at once: headers and body written separately with
    # Nagle on meet the client's delayed ACK and cost 40 ms per request on keep-alive.
    wbufsize = -1  # buffered; handle_one_request flushes after each response
    disable_nagle_algorithm = True
    # A connection idle (or a client silent mid-request, or a TLS handshake stalled) for
    # this long is closed, so a stuck client cannot pin a thread forever. Longer than Go's
    # default idle-connection timeout (90 s): kube-scheduler closes its idle connections
    # first, and never races a request against the server's close.
    timeout = 120
    app: SchedulerApp

    def _send(self, r: Response) -> None:
        self.send_response(r.status)
        self.send_header("Content-Type", r.content_type)
        self.send_header("Content-Length", str(len(r.body)))
        self.end_headers()
        self.wfile.write(r.body)

    def _plain(self, status: int, text: str) -> None:
        self._send(Response(status, text.encode(), "text/plain"))

    def do_GET(self) -> None:
        self._send(self.app.handle("GET", self.path, b""))

    def do_POST(self) -> None:
        raw = self.headers.get("Content-Length")
        if raw is None:
            self.close_connection = True
            self._plain(411, "Content-Length required")
            return
        try:
            length = int(raw)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            self._plain(400, "bad Content-Length")
            return
        if length > MAX_BODY:
            self.close_connection = True
            self._plain(413, f"body over {MAX_BODY} bytes")
            return
        body = self.rfile.read(length)
        self._send(self.app.handle("POST", self.path, body))

    def do_PUT(self) -> None:
        self.close_connection = True
        self._plain(405, "method not allowed")

    do_DELETE = do_PATCH = do_PUT

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class Server:
    """One listening socket serving ``app`` on a background thread."""

    def __init__(
        self, app: SchedulerApp, host: str, port: int, tls: ssl.SSLContext | None = None
    ) -> None:
        handler = type("Handler", (_Handler,), {"app": app})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(app: SchedulerApp, host: str, port: int, tls: ssl.SSLContext | None = None) -> Server:
    server = Server(app, host, port, tls)
    server.start()
    return server
