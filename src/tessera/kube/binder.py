"""Binders: the one API write the extender waits on, done from an event loop.

The extender's HTTP server runs on an event loop; ``bind`` is the only verb that waits
on the API server (a pods/binding create, ~1 ms unloaded, hundreds of ms when the API
server is saturated). A ``Binder`` does that write without holding the loop:

* ``AioBinder`` sends it with aiohttp's client on the loop itself, over a pool of kept
  connections: no thread, no hand-off between threads, a C-parsed response. This is
  what ``tessera scheduler`` uses against a real API server: the extender spent 12-24 %
  less CPU per pod with it than with urllib3 on a thread pool (docs/benchmarks.md).
* ``ThreadedBinder`` runs any ``KubeApi``'s blocking ``bind`` on a thread pool: the
  in-memory ``FakeKube`` in tests, or a client that has no async transport.

Both keep one contract, ``bind_once``'s: the pod ends up bound to the node with the
annotations, or an ``ApiError`` says why not (``Conflict`` when the pod is bound
elsewhere or otherwise, or was replaced; ``Unavailable`` when the API server does not
answer in time, ``NotSent`` when no connection to it could be made). A pod that is
already bound exactly so -- an earlier try of the same bind landed, and this one was
sent again by a kube-scheduler that gave up waiting or reached a restarted replica --
counts as bound: the API server answers Conflict, and the binder reads the pod to tell
the two apart.
"""

from __future__ import annotations

import asyncio
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import aiohttp

from tessera.kube.client import KubeClient, binding_body
from tessera.kube.errors import ApiError, Conflict, NotSent, Unavailable, error_from_status
from tessera.kube.kinds import PODS
from tessera.kube.port import KubeApi, Obj

__all__ = ["AioBinder", "Binder", "ThreadedBinder", "bind_once", "bound_so"]


def bound_so(pod: Obj, uid: str, node: str, annotations: dict[str, str]) -> bool:
    """Whether ``pod`` is bound already the way this bind would bind it: same UID (when
    one is given), same node, and every one of the annotations with the same value."""
    meta = pod.get("metadata") or {}
    if uid and meta.get("uid") != uid:
        return False
    if (pod.get("spec") or {}).get("nodeName") != node:
        return False
    have = meta.get("annotations") or {}
    return all(have.get(k) == v for k, v in annotations.items())


def bind_once(
    api: KubeApi, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
) -> None:
    """``api.bind``, except that a pod already bound exactly so is not an error."""
    try:
        api.bind(namespace, name, uid, node, annotations)
    except Conflict as conflict:
        try:
            pod = api.get(PODS, name, namespace)
        except ApiError:
            raise conflict from None
        if not bound_so(pod, uid, node, annotations):
            raise


class Binder(Protocol):
    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None: ...

    async def close(self) -> None:
        """Release what was opened for the running loop."""


class ThreadedBinder:
    """``api.bind`` on a pool of ``threads`` (as many as the client has connections:
    more would only wait for one)."""

    def __init__(self, api: KubeApi, threads: int = 32) -> None:
        self._api = api
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tessera-bind")

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        call = functools.partial(bind_once, self._api, namespace, name, uid, node, annotations)
        await asyncio.get_running_loop().run_in_executor(self._pool, call)

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class AioBinder:
    """pods/binding through aiohttp, with ``client``'s server, TLS and credentials.

    One session per event loop (a session belongs to the loop that made it; the
    extender and the webhook serve from different loops), made on the first bind.
    """

    def __init__(self, client: KubeClient, connections: int = 32, timeout_s: float = 30.0) -> None:
        self._client = client
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=5.0)
        self._ssl = client.ssl_context()
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._connections, ssl=self._ssl if self._ssl is not None else False
            )
            session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
            self._sessions[loop] = session
        return session

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        path, body = binding_body(namespace, name, uid, node, annotations)
        status, data = await self._request("POST", path, json.dumps(body).encode())
        if status < 300:
            return
        error = error_from_status(status, data)
        if not isinstance(error, Conflict):
            raise error
        try:  # the pod cannot be read: the Conflict stands
            status, data = await self._request("GET", PODS.path(namespace, name))
            pod = json.loads(data) if status == 200 else None
        except (Unavailable, ValueError):
            pod = None
        if not isinstance(pod, dict) or not bound_so(pod, uid, node, annotations):
            raise error

    async def _request(
        self, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, bytes]:
        try:
            async with self._session().request(
                method,
                self._client.host + path,
                data=body,
                headers=self._client.headers("application/json" if body is not None else None),
                server_hostname=self._client.server_hostname(),
            ) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            # No connection (refused, unresolvable, TLS refused, none free in time): the
            # Binding never went out, so its cards are free at once.
            raise NotSent(0, "Unavailable", f"{method} {path}: {exc!r}") from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise Unavailable(0, "Unavailable", f"{method} {path}: {exc!r}") from exc

    async def close(self) -> None:
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()
