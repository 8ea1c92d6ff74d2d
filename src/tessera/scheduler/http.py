"""The socket side: aiohttp serving the app from one event-loop thread per port.

Why aiohttp and not the stdlib server: kube-scheduler binds asynchronously, so under a
burst tens of binds wait on the API server at once, each on its own connection. The
stdlib ``ThreadingHTTPServer`` spends a thread per connection and parses headers in
Python; with a do-nothing extender it alone held kube-scheduler to ~63 % of its stock
rate on a 2-core machine, against ~75 % on aiohttp (C parser, every connection on one
loop). The measurement is in docs/benchmarks.md.

What runs where: everything -- filter, prioritize, the webhook, the probes, /metrics,
and bind's decision -- is sub-millisecond CPU and runs on the loop itself, with no
thread hop. The GPU map (/gpus.json, ``--web``) takes seconds on a large cluster and is
built on a thread of its own (``Offload``). The one thing that waits is bind's API
write: the loop hands it to a ``Binder`` (kube/binder.py) and serves other requests
until it ends. ``tessera scheduler`` gives an ``AioBinder`` (the write on this loop,
through aiohttp's client); without one, a ``ThreadedBinder`` runs the app's
``KubeApi.bind`` on a thread pool.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from tessera.kube.binder import Binder, ThreadedBinder
from tessera.scheduler.app import BindWrite, Offload, Response, SchedulerApp
from tessera.scheduler.tls import RECHECK_S

__all__ = ["MAX_BODY", "Server", "serve"]

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # 5,000 full Node objects fit; names-only bodies are ~100 KB
KEEPALIVE_S = 120.0


class Server:
    """One listening socket serving ``app`` from a background event-loop thread."""

    def __init__(
        self,
        app: SchedulerApp,
        host: str,
        port: int,
        tls: ssl.SSLContext | None = None,
        binder: Binder | None = None,
        shutdown_timeout_s: float = 10.0,
        recheck_tls: Callable[[], object] | None = None,
    ) -> None:
        self.app = app
        self.binder = binder if binder is not None else ThreadedBinder(app.api)
        # One thread for the answers too slow for the loop (the GPU map): requests for
        # them queue there, and filter and bind keep being served meanwhile.
        self._offload = ThreadPoolExecutor(1, thread_name_prefix="tessera-offload")
        self._loop = asyncio.new_event_loop()
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
        try:
            self._loop.run_until_complete(site.start())
        except OSError:  # the port is taken: close what was opened, let the caller say so
            self._loop.run_until_complete(self._cleanup())
            self._loop.close()
            raise
        self.port = int(self._runner.addresses[0][1])
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tessera-http-{self.port}", daemon=True
        )
        if recheck_tls is not None:
            # On this loop, beside the handshakes that pick up what it loads.
            self._loop.call_soon(self._recheck, recheck_tls)

    def _recheck(self, recheck_tls: Callable[[], object]) -> None:
        try:
            recheck_tls()
        except Exception:
            log.exception("checking the serving certificate for a change")
        self._loop.call_later(RECHECK_S, self._recheck, recheck_tls)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.raw_path
        out = self.app.dispatch(
            request.method, path, body, request.headers.get("Accept-Encoding", "")
        )
        if isinstance(out, Response):
            r = out
        elif isinstance(out, Offload):
            r = await self._loop.run_in_executor(self._offload, out.work)
        else:
            r = await self._write(out)
        log.debug("%s %s %s -> %d", request.remote, request.method, path, r.status)
        headers = {"Content-Type": r.content_type}
        if r.encoding:
            headers["Content-Encoding"] = r.encoding
        if r.pieces:
            return await self._send_pieces(request, r.status, headers, r.pieces)
        return web.Response(status=r.status, body=r.body, headers=headers)

    async def _send_pieces(
        self, request: web.Request, status: int, headers: dict[str, str], pieces: tuple[bytes, ...]
    ) -> web.StreamResponse:
        """A body written a piece at a time, waiting for the socket between pieces: handed
        over whole, a 38 MB body is copied into the transport's buffer on the loop."""
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = sum(map(len, pieces))
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
        await resp.write_eof()
        return resp

    async def _write(self, write: BindWrite) -> Response:
        refused = self.app.fence(write)
        if refused is not None:
            return refused
        try:
            await self.binder.bind(*write.call)
        except Exception as exc:
            return self.app.bind_done(write, exc)
        return self.app.bind_done(write)

    def start(self) -> None:
        self._thread.start()

    async def _cleanup(self) -> None:
        await self._runner.cleanup()
        await self.binder.close()
        self._offload.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        """Close the socket and the open connections, then the binder and the loop."""
        if self._thread.is_alive():
            cleanup = asyncio.run_coroutine_threadsafe(self._cleanup(), self._loop)
            cleanup.result(self._shutdown_timeout_s + 5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)
        else:
            self._loop.run_until_complete(self._cleanup())
        self._loop.close()


def serve(
    app: SchedulerApp,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
    binder: Binder | None = None,
    recheck_tls: Callable[[], object] | None = None,
) -> Server:
    server = Server(app, host, port, tls, binder, recheck_tls=recheck_tls)
    server.start()
    return server
