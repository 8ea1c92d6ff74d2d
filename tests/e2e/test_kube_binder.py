"""Both binders against the real API server: the pods/binding write the extender's HTTP
server waits on. The contract of ``bind_once``: node and annotations in one write, the
same bind again is done (its first try landed), ``Conflict`` for a pod bound otherwise or
replaced, ``Unavailable`` when nothing answers."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tessera.kube import PODS, Conflict, Unavailable
from tessera.kube.binder import AioBinder, Binder, ThreadedBinder
from tessera.kube.client import KubeClient
from tessera.kube.errors import NotSent, outcome_unknown
from tessera.testenv import TestEnv
from tessera.testenv.process import free_port

pytestmark = pytest.mark.e2e

BINDERS: dict[str, Callable[[KubeClient], Binder]] = {
    "aio": AioBinder,
    "threaded": ThreadedBinder,
}


@pytest.fixture
def api(testenv: TestEnv) -> Iterator[KubeClient]:
    yield KubeClient.from_kubeconfig(str(testenv.kubeconfig))


def _unscheduled_pod(api: KubeClient, name: str) -> str:
    pod = {
        "metadata": {"name": name},
        # No scheduler serves this name: the pod waits for the binder.
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
    }
    return str(api.create(PODS, pod, "default")["metadata"]["uid"])


def _binds(binder: Binder, *calls: tuple[str, str, str, dict[str, str]]) -> list[object]:
    """Run the binds one after another on one loop; each one's result or error."""

    async def go() -> list[object]:
        out: list[object] = []
        try:
            for name, uid, node, annotations in calls:
                try:
                    await binder.bind("default", name, uid, node, annotations)
                    out.append(None)
                except Exception as exc:
                    out.append(exc)
        finally:
            await binder.close()
        return out

    return asyncio.run(go())


@pytest.mark.parametrize("kind", sorted(BINDERS))
def test_binder_writes_node_and_annotation_in_one_binding(api: KubeClient, kind: str) -> None:
    name = f"bind-{kind}"
    uid = _unscheduled_pod(api, name)
    _unscheduled_pod(api, f"{name}-2")
    try:
        first, same, other_cards, other_node, stale, replaced = _binds(
            BINDERS[kind](api),
            (name, uid, "node-a", {"tessera.io/assignment": "x"}),
            (name, uid, "node-a", {"tessera.io/assignment": "x"}),  # a retry of the same
            (name, uid, "node-a", {"tessera.io/assignment": "y"}),
            (name, uid, "node-b", {}),
            (f"{name}-2", uid, "node-a", {}),  # another pod's UID: the pod was replaced
            # Bound just so, but a pod of the same name that is not the one this bind was
            # for: not this bind's success.
            (name, f"{uid}-gone", "node-a", {"tessera.io/assignment": "x"}),
        )
        assert first is None and same is None
        stored = api.get(PODS, name, "default")
        assert stored["spec"]["nodeName"] == "node-a"
        assert stored["metadata"]["annotations"]["tessera.io/assignment"] == "x"
        for refused in (other_cards, other_node):
            assert isinstance(refused, Conflict) and "already assigned" in str(refused)
        assert isinstance(stale, Conflict) and isinstance(replaced, Conflict)
        assert not api.get(PODS, f"{name}-2", "default")["spec"].get("nodeName")
    finally:
        for n in (name, f"{name}-2"):
            api.delete(PODS, n, "default")


def test_aio_binder_says_unavailable_when_nothing_listens(testenv: TestEnv) -> None:
    cfg = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=str(testenv.kubeconfig), client_configuration=cfg)
    cfg.host = f"https://127.0.0.1:{free_port()}"  # the same TLS settings, nobody there
    (result,) = _binds(AioBinder(KubeClient(cfg)), ("p", "uid", "n", {}))
    assert isinstance(result, Unavailable) and "binding" in str(result)
    assert (result.status, result.reason) == (0, "Unavailable")
    # No connection, so nothing sent: the bind's cards need not be held in doubt.
    assert isinstance(result, NotSent) and not outcome_unknown(result)


def test_aio_binder_gives_up_on_an_api_server_that_never_answers() -> None:
    # Connections are taken and never answered: the bind ends at its deadline, as
    # Unavailable (its outcome unknown to the caller), instead of holding the pod.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        cfg = k8s_client.Configuration()
        cfg.host = f"http://127.0.0.1:{hung.getsockname()[1]}"
        started = time.monotonic()
        (result,) = _binds(AioBinder(KubeClient(cfg), timeout_s=0.5), ("p", "uid", "n", {}))
        waited = time.monotonic() - started
    assert isinstance(result, Unavailable) and "TimeoutError" in str(result)
    assert outcome_unknown(result)  # taken, maybe read: it may have landed
    assert waited < 30  # the deadline, not aiohttp's five-minute default
