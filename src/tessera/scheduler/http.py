"""The socket side: aiohttp serving the app from one event-loop thread per port.

Why aiohttp and not the stdlib server: kube-scheduler binds asynchronously, so under a
burst tens of binds wait on the API server at once, each on its own connection. The
stdlib ``ThreadingHTTPServer`` spends a thread per connection and parses headers in
Python; with a do-nothing extender it alone held kube-scheduler to ~63 % of its stock
rate on a 2-core machine, against ~75 % on aiohttp (C parser, every connection on one
loop). The measurement is in docs/benchmarks.md.

What runs where:

* ``bind`` waits on the API server, so it runs on a bounded thread pool (as many
  threads as the API client has connections: more would only wait for one);
* everything else -- filter, prioritize, the webhook, the probes, /metrics -- is
  sub-millisecond CPU and runs on the loop itself, with no thread hop.

Bodies over ``MAX_BODY`` get 413 (aiohttp's ``client_max_size``). A connection idle
for ``KEEPALIVE_S`` is closed; that is longer than Go's idle-connection timeout (90 s),
so kube-scheduler closes its idle connections first and never races a request against
the server's close. A client that stalls mid-request costs a socket, not a thread.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from tessera.scheduler.app import Response, SchedulerApp

__all__ = ["BLOCKING_ROUTES", "MAX_BODY", "Server", "serve"]

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # 5,000 full Node objects fit; names-only bodies are ~100 KB
KEEPALIVE_S = 120.0
BLOCKING_ROUTES = frozenset({"/bind"})  # they wait on the API server: off the loop


class Server:
    """One listening socket serving ``app`` from a background event-loop thread."""

    def __init__(
        self,
        app: SchedulerApp,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
        blocking_threads: int = 32,
        shutdown_timeout_s: float = 10.0,
    ) -> None:
        self.app = app
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(blocking_threads, thread_name_prefix="tessera-bind")
        web_app = web.Application(client_max_size=MAX_BODY)
        web_app.router.add_route("*", "/{tail:.*}", self._handle)
        # On stop, requests in flight get shutdown_timeout_s to finish: a bind waiting on
        # a stuck API server must not hold the process (kube-scheduler gave up after 5 s).
        self._runner = web.AppRunner(
            web_app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=KEEPALIVE_S,
            shutdown_timeout=shutdown_timeout_s,
        )
        self._shutdown_timeout_s = shutdown_timeout_s
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, host, port, ssl_context=tls)
        self._loop.run_until_complete(site.start())
        self.port = int(self._runner.addresses[0][1])
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tessera-http-{self.port}", daemon=True
        )

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        path = request.raw_path
        if request.method == "POST" and path.split("?", 1)[0].rstrip("/") in BLOCKING_ROUTES:
            r: Response = await self._loop.run_in_executor(
                self._pool, self.app.handle, request.method, path, body
            )
        else:
            r = self.app.handle(request.method, path, body)
        log.debug("%s %s %s -> %d", request.remote, request.method, path, r.status)
        return web.Response(status=r.status, body=r.body, headers={"Content-Type": r.content_type})

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Close the socket and the open connections, then the loop and the pool."""
        if self._thread.is_alive():
            cleanup = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            cleanup.result(self._shutdown_timeout_s + 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
        else:
            self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def serve(app: SchedulerApp, host: str, port: int, tls: ssl.SSLContext | None = None) -> Server:
    server = Server(app, host, port, tls)
    server.start()
    return server
