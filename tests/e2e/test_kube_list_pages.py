"""Paged lists against the real API server: what the reflector relies on when it lists
pods 500 at a time (kube/reflector.py) -- every page of one snapshot at one
resourceVersion, a continue token until the last page, a malformed token refused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.kube import PODS, ApiError, Reflector, WatchEvent
from tessera.kube.client import KubeClient
from tessera.testenv import TestEnv

pytestmark = pytest.mark.e2e


@pytest.fixture
def api(testenv: TestEnv) -> Iterator[KubeClient]:
    client = KubeClient.from_kubeconfig(str(testenv.kubeconfig))
    yield client
    for pod in client.list(PODS, "default", label_selector="list-pages").items:
        client.delete(PODS, pod["metadata"]["name"], "default")  # unbound: gone at once


def _pod(name: str, label: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"list-pages": label}},
        # No scheduler serves this name: the pods stay as created.
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]},
    }


def _names(items: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in items]


def test_a_paged_list_is_one_snapshot_with_a_token_until_its_last_page(
    api: KubeClient,
) -> None:
    label = uuid.uuid4().hex[:8]
    for i in range(5):
        api.create(PODS, _pod(f"pages-{label}-{i}", label), "default")
    selector = f"list-pages={label}"
    first = api.list(PODS, "default", label_selector=selector, limit=2)
    api.create(PODS, _pod(f"pages-{label}-late", label), "default")  # after the snapshot
    second = api.list(PODS, "default", label_selector=selector, limit=2,
                      continue_token=first.continue_token)  # fmt: skip
    last = api.list(PODS, "default", label_selector=selector, limit=2,
                    continue_token=second.continue_token)  # fmt: skip
    listed = [_names(r.items) for r in (first, second, last)]
    assert listed == [[f"pages-{label}-{i}" for i in pair] for pair in ((0, 1), (2, 3), (4,))]
    assert first.continue_token and second.continue_token and last.continue_token == ""
    assert {r.resource_version for r in (first, second, last)} == {first.resource_version}
    assert len(api.list(PODS, "default", label_selector=selector).items) == 6
    with pytest.raises(ApiError) as bad:
        api.list(PODS, "default", label_selector=selector, limit=2, continue_token="nope")
    assert bad.value.status == 400


def test_the_reflector_takes_a_paged_list_from_the_api_server(api: KubeClient) -> None:
    label = uuid.uuid4().hex[:8]
    for i in range(7):
        api.create(PODS, _pod(f"reflect-{label}-{i}", label), "default")

    class Pages:
        def __init__(self) -> None:
            self.sizes: list[int] = []
            self.names: set[str] = set()

        def replace(self, items: list[dict[str, Any]]) -> None:
            raise AssertionError("a paged handler is given pages")

        def replace_pages(self, pages: Iterator[list[dict[str, Any]]]) -> None:
            for page in pages:
                self.sizes.append(len(page))
                self.names |= set(_names(page))

        def apply(self, event: WatchEvent) -> None:
            self.names.add(event.object["metadata"]["name"])

    view = Pages()
    r = Reflector(api, PODS, view, namespace="default", label_selector=f"list-pages={label}",
                  page_size=3, watch_timeout_s=5)  # fmt: skip
    r.start()
    try:
        assert r.synced.wait(30)
        assert view.sizes == [3, 3, 1]
        assert view.names == {f"reflect-{label}-{i}" for i in range(7)}
    finally:
        r.stop()
