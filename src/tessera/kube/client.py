"""``KubeClient``: the real API server behind the ``KubeApi`` port.

Configuration (kubeconfig or in-cluster service account) comes from the official
``kubernetes`` client; requests go straight through its configured urllib3 pool and
bodies stay JSON dicts (see ``port.py`` for why). Foreign errors become ``ApiError`` here
and nowhere else.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tessera.kube.errors import (
    ApiError,
    KubeconfigError,
    NotSent,
    Unavailable,
    error_from_status,
)
from tessera.kube.kinds import PODS, Kind
from tessera.kube.port import ListResult, Obj, WatchEvent

__all__ = ["KubeClient", "binding_body"]

_WATCH_TYPES = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK"}


class KubeClient:
    """Talks to one API server. Thread-safe: the pool is shared, requests are not."""

    def __init__(self, configuration: k8s_client.Configuration, timeout_s: float = 30.0) -> None:
        self._config = configuration
        self._host = configuration.host.rstrip("/")
        # Our own pool, blocking when every connection is busy: under a burst, callers
        # wait for a connection instead of opening (and TLS-handshaking) throwaway ones.
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=configuration.connection_pool_maxsize or 32,
            block=True,
            cert_reqs="CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE",
            ca_certs=configuration.ssl_ca_cert,
            ca_cert_data=configuration.ca_cert_data,
            cert_file=configuration.cert_file,
            key_file=configuration.key_file,
            assert_hostname=configuration.assert_hostname,
            server_hostname=configuration.tls_server_name,
        )
        self._timeout = urllib3.Timeout(connect=5.0, read=timeout_s)

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, context: str | None = None, pool_size: int = 32
    ) -> KubeClient:
        """From a kubeconfig file, or in-cluster config when ``path`` is None and it works.
        ``pool_size``: connections kept to the API server (threads calling at once).
        KubeconfigError names the file when neither loads."""
        configuration = k8s_client.Configuration()
        configuration.connection_pool_maxsize = pool_size
        if path is None:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                return cls(configuration)
            except k8s_config.ConfigException:
                pass
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
        except (k8s_config.ConfigException, OSError) as exc:
            where = path or "(in-cluster, else the default)"
            raise KubeconfigError(f"kubeconfig {where}: {exc}") from exc
        return cls(configuration)

    # --- what another transport needs (kube/binder.py) --------------------------------

    @property
    def host(self) -> str:
        return self._host

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings of the urllib3 pool as an ``SSLContext`` (None for http://)."""
        cfg = self._config
        if not self._host.startswith("https://"):
            return None
        cadata = cfg.ca_cert_data
        if isinstance(cadata, bytes):
            cadata = cadata.decode()  # PEM text; ssl takes bytes as DER
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert, cadata=cadata)
        if not cfg.verify_ssl:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif cfg.assert_hostname is False:
            ctx.check_hostname = False
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        return ctx

    def server_hostname(self) -> str | None:
        """The name to verify the server's certificate against, when not the host's."""
        name = self._config.tls_server_name
        return str(name) if name else None

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        """Accept, User-Agent and the current bearer token (refreshed when it has a hook).

        Unavailable (NotSent) when the token cannot be read now (in a pod, the
        service-account token file is read again as it rotates): every caller already
        retries an API server it cannot reach, and a background loop must not die of
        it; a write that never went out is known not to have landed."""
        try:
            return self._headers(content_type)
        except (k8s_config.ConfigException, OSError) as exc:
            raise NotSent(0, "Unavailable", f"credentials: {exc}") from exc

    # --- plumbing -------------------------------------------------------------------

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "tessera"}
        if content_type:
            headers["Content-Type"] = content_type
        if self._config.refresh_api_key_hook is not None:
            self._config.refresh_api_key_hook(self._config)
        auth = self._config.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers["Authorization"] = str(auth["value"])
        return headers

    def _request(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self._host + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        headers = self.headers(content_type if data is not None else None)
        try:
            resp = self._pool.request(
                method, url, body=data, headers=headers, timeout=self._timeout, retries=False
            )
        except urllib3.exceptions.ConnectTimeoutError as exc:  # NewConnectionError too
            # No connection, so no request: a write refused here cannot have landed.
            raise NotSent(0, "Unavailable", f"{method} {path}: {exc}") from exc
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(0, "Unavailable", f"{method} {path}: {exc}") from exc
        if resp.status >= 300:
            raise error_from_status(resp.status, resp.data)
        if not resp.data:
            return None
        try:
            return json.loads(resp.data)
        except ValueError as exc:
            raise ApiError(resp.status, "BadResponse", f"{method} {path}: not JSON") from exc

    # --- the port -------------------------------------------------------------------

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> ListResult:
        query = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit,
            "continue": continue_token,
        }
        obj = self._request("GET", kind.path(namespace), query)
        meta = obj.get("metadata") or {}
        return ListResult(
            items=obj.get("items") or [],
            resource_version=str(meta.get("resourceVersion", "")),
            continue_token=str(meta.get("continue") or ""),
        )

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
    ) -> Iterator[WatchEvent]:
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
        }
        url = (
            self._host
            + kind.path(namespace)
            + "?"
            + urlencode({k: v for k, v in query.items() if v is not None})
        )
        try:
            resp = self._pool.request(
                "GET",
                url,
                headers=self.headers(),
                timeout=urllib3.Timeout(connect=5.0, read=timeout_s + 30),
                preload_content=False,
                retries=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(0, "Unavailable", f"watch {kind.plural}: {exc}") from exc
        try:
            if resp.status >= 300:
                raise error_from_status(resp.status, resp.read())
            for line in watch_lines(resp.stream(65536)):
                yield _watch_event(line)
        except urllib3.exceptions.HTTPError as exc:
            raise Unavailable(0, "Unavailable", f"watch {kind.plural}: {exc}") from exc
        finally:
            resp.release_conn()

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        return dict(self._request("GET", kind.path(namespace, name)))

    def create(self, kind: Kind, body: Obj, namespace: str | None = None) -> Obj:
        return dict(self._request("POST", kind.path(namespace), body=body))

    def replace(self, kind: Kind, body: Obj, namespace: str | None = None) -> Obj:
        name = body["metadata"]["name"]
        return dict(self._request("PUT", kind.path(namespace, name), body=body))

    def merge_patch(
        self,
        kind: Kind,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        subresource: str = "",
    ) -> Obj:
        path = kind.path(namespace, name) + (f"/{subresource}" if subresource else "")
        return dict(
            self._request("PATCH", path, body=patch, content_type="application/merge-patch+json")
        )

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        self._request("DELETE", kind.path(namespace, name))

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: dict[str, str] | None = None,
    ) -> None:
        path, body = binding_body(namespace, name, uid, node, annotations)
        self._request("POST", path, body=body)

    def evict(self, namespace: str, name: str, uid: str) -> None:
        path, body = eviction_body(namespace, name, uid)
        self._request("POST", path, body=body)


def eviction_body(namespace: str, name: str, uid: str) -> tuple[str, Obj]:
    """The path and body of a pods/eviction create, the pod's UID a precondition."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
        "deleteOptions": {"preconditions": {"uid": uid}},
    }
    return PODS.path(namespace, name) + "/eviction", body


def binding_body(
    namespace: str, name: str, uid: str, node: str, annotations: dict[str, str] | None
) -> tuple[str, Obj]:
    """The path and body of a pods/binding create: the UID is a precondition, and the
    annotations are merged onto the pod in the same write (see port.py)."""
    meta: Obj = {"name": name, "namespace": namespace, "uid": uid}
    if annotations:
        meta["annotations"] = dict(annotations)
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    return PODS.path(namespace, name) + "/binding", body


def watch_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The non-blank lines of a watch stream, however its chunks cut them.

    Each chunk is split once and a line's unfinished head is kept aside until its
    end arrives, so the work is linear in the bytes (splitting a growing buffer a
    line at a time copied the rest of the chunk for every event).
    """
    head: list[bytes] = []
    for chunk in chunks:
        *ended, rest = chunk.split(b"\n")
        if ended:
            if head:
                ended[0] = b"".join(head) + ended[0]
                head = []
            yield from (line for line in ended if line.strip())
        if rest:
            head.append(rest)
    tail = b"".join(head)
    if tail.strip():
        yield tail


def _watch_event(line: bytes) -> WatchEvent:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ApiError(0, "BadResponse", f"watch: a line is not JSON: {line[:200]!r}") from exc
    kind = obj.get("type")
    if kind == "ERROR":
        raise error_from_status(200, obj.get("object"))
    if kind not in _WATCH_TYPES:
        raise ApiError(0, "BadResponse", f"watch: unknown event type {kind!r}")
    return WatchEvent(type=kind, object=obj.get("object") or {})
