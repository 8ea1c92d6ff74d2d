"""What an API server's answer becomes: the error class a caller branches on, with the
server's own reason and message, and whether a failed write may have landed."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tessera.kube.client import KubeClient
from tessera.kube.errors import (
    MANY_BUDGETS,
    ApiError,
    Conflict,
    Gone,
    KubeconfigError,
    NotFound,
    NotSent,
    Unavailable,
    error_from_status,
    outcome_unknown,
)
from tessera.kube.kinds import PODS
from tessera.testenv.process import free_port


def _status(code: int, reason: str, message: str) -> dict[str, object]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}  # fmt: skip


@pytest.mark.parametrize(
    ("code", "cls"), [(404, NotFound), (409, Conflict), (410, Gone), (403, ApiError)]
)
def test_a_status_body_gives_the_class_reason_and_message(code: int, cls: type) -> None:
    body = _status(code, "Some", "what the server said")
    for form in (body, json.dumps(body), json.dumps(body).encode()):
        err = error_from_status(code, form)
        assert type(err) is cls
        assert (err.status, err.reason, err.message) == (code, "Some", "what the server said")


def test_a_body_that_is_not_json_is_kept_as_the_message_and_the_class_names_the_reason() -> None:
    err = error_from_status(502, b"  <html>bad gateway</html>\n")
    assert (type(err), err.status, err.reason, err.message) == (
        ApiError, 502, "ApiError", "<html>bad gateway</html>")  # fmt: skip
    assert len(error_from_status(500, "x" * 2000).message) == 500  # a page is cut short
    err = error_from_status(404, None)
    assert (type(err), err.reason, err.message) == (NotFound, "NotFound", "")
    assert str(err) == "404 NotFound: "


def test_a_status_inside_a_watch_stream_takes_its_own_code() -> None:
    # A watch answers 200, then sends {"type":"ERROR","object":Status}: 410 is "re-list".
    err = error_from_status(200, _status(410, "Expired", "too old resource version: 5"))
    assert type(err) is Gone and err.status == 410
    assert type(error_from_status(403, _status(500, "X", "m"))) is ApiError  # not a watch
    assert error_from_status(403, _status(500, "X", "m")).status == 403


@pytest.mark.parametrize(
    ("err", "unknown"),
    [
        (Unavailable(0, "Unavailable", "connection reset"), True),
        (ApiError(504, "Timeout", "the server was unable to return a response in time"), True),
        (ApiError(500, "InternalError", "etcdserver: request timed out"), True),
        (Conflict(409, "Conflict", 'pod p is already assigned to node "n1"'), False),
        (ApiError(400, "BadRequest", "malformed"), False),
        (ApiError(429, "TooManyRequests", "throttled"), False),
        (NotFound(404, "NotFound", 'pods "p" not found'), False),
        # The Eviction API's 500 for a pod two budgets cover: a refusal, as read from it.
        (error_from_status(500, _status(500, "", MANY_BUDGETS)), False),
        (ApiError(500, "InternalError", f"{MANY_BUDGETS} And more."), True),
        (NotSent(0, "Unavailable", "credentials: no token"), False),  # nothing went out
    ],
)
def test_which_failed_writes_may_have_landed(err: ApiError, unknown: bool) -> None:
    assert outcome_unknown(err) is unknown


def test_a_kubeconfig_that_does_not_load_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "none.yaml"
    with pytest.raises(KubeconfigError, match=rf"^kubeconfig {missing}: "):
        KubeClient.from_kubeconfig(str(missing))
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(KubeconfigError, match=rf"^kubeconfig {empty}: .*context"):
        KubeClient.from_kubeconfig(str(empty), context="nowhere")


def test_a_service_account_token_that_does_not_read_is_unavailable_not_a_crash(
    tmp_path: Path,
) -> None:
    """In a pod the client re-reads its token file as the token rotates (the Kubernetes
    library's in-cluster hook). A token that cannot be read at that moment is an API
    server out of reach, which every caller retries, not an error no loop expects."""
    from datetime import timedelta

    from kubernetes import client as k8s_client
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("t0")
    ca.write_text("not read before a connection")
    port = free_port()  # nothing listens: a request that gets past its token is refused
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
    loader = InClusterConfigLoader(str(token), str(ca), environ=environ)
    loader._token_refresh_period = timedelta(0)  # read again at every request
    cfg = k8s_client.Configuration()
    loader.load_and_set(cfg)
    api = KubeClient(cfg)
    token.unlink()
    with pytest.raises(NotSent, match=r"^0 Unavailable: credentials: \[Errno 2\] No such file"):
        api.get(PODS, "p", "ns")
    token.write_text("")
    with pytest.raises(Unavailable, match=r"^0 Unavailable: credentials: Token file exists but"):
        api.get(PODS, "p", "ns")
    with pytest.raises(Unavailable, match=r"^0 Unavailable: credentials: "):
        list(api.watch(PODS, "1", "ns"))
    token.write_text("t1")
    with pytest.raises(Unavailable, match=r"^0 Unavailable: GET /api/v1/namespaces/ns/pods/p: "):
        api.get(PODS, "p", "ns")
    assert api.headers()["Authorization"] == "bearer t1"


def test_a_write_with_no_connection_was_not_sent_and_one_unanswered_may_have_landed() -> None:
    from kubernetes import client as k8s_client

    cfg = k8s_client.Configuration()
    cfg.host = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused at connect
    with pytest.raises(NotSent, match=r"^0 Unavailable: POST /api/v1/namespaces/ns/pods/p/evi"):
        KubeClient(cfg).evict("ns", "p", "uid")
    with socket.socket() as hung:  # the kernel takes the connection; nobody answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        cfg.host = f"http://127.0.0.1:{hung.getsockname()[1]}"
        with pytest.raises(Unavailable) as unanswered:
            KubeClient(cfg, timeout_s=0.2).evict("ns", "p", "uid")
    assert not isinstance(unanswered.value, NotSent)
    assert outcome_unknown(unanswered.value)
