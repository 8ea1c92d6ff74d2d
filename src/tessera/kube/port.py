"""The port: what Tessera asks of the Kubernetes API, as one small interface.

Objects travel as plain JSON dicts (what the API server sends), never as generated
client models: decoding 5,000 Nodes into models costs seconds; a dict costs what
``json.loads`` costs. Two implementations speak this contract: ``KubeClient`` (the real
API server, ``client.py``) and ``FakeKube`` (in memory, ``fake.py``, for unit tests).

The contract, shared by both:

* ``list`` returns the items and the list's resourceVersion; ``watch`` yields events
  after that resourceVersion and raises ``Gone`` when it is too old (list again).
* Writes take optimistic-concurrency preconditions: a ``merge_patch`` whose body has
  ``metadata.resourceVersion`` (or ``metadata.uid``) fails with ``Conflict`` when the
  stored object differs; ``replace`` (PUT) always carries the resourceVersion read.
* ``bind`` creates a pods/binding; it fails with ``Conflict`` when the pod is already
  bound or its UID is not ``uid``. Its ``annotations`` are merged onto the pod by the
  API server in the same write that sets ``spec.nodeName``: both happen, or neither.
* Errors are ``tessera.kube.errors.ApiError`` subclasses; nothing else escapes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tessera.kube.kinds import Kind

__all__ = ["KubeApi", "ListResult", "Obj", "WatchEvent", "object_name", "resource_version"]

Obj = dict[str, Any]


def resource_version(obj: Obj | None) -> str:
    """The object's ``metadata.resourceVersion``, "" when it has none."""
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


def object_name(obj: Mapping[str, Any] | None) -> str:
    """The object's ``metadata.name``, "" when it has none."""
    return str(((obj or {}).get("metadata") or {}).get("name") or "")


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[Obj]
    resource_version: str
    # A page of a paged list (``limit``): pass it back as ``continue_token`` for the next
    # page; "" on the last page.
    continue_token: str = ""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: Obj


class KubeApi(Protocol):
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
        """Every object (``limit`` None), or a page of at most ``limit`` of them; the next
        pages with the last page's ``continue_token``, all of one consistent snapshot.
        ``Gone`` when the token has expired (the snapshot was compacted away)."""
        ...

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_s: int = 300,
    ) -> Iterator[WatchEvent]: ...

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj: ...

    def create(self, kind: Kind, body: Obj, namespace: str | None = None) -> Obj: ...

    def replace(self, kind: Kind, body: Obj, namespace: str | None = None) -> Obj: ...

    def merge_patch(
        self,
        kind: Kind,
        name: str,
        patch: Obj,
        namespace: str | None = None,
        subresource: str = "",
    ) -> Obj:
        """RFC 7386 merge patch of the object (or of its ``subresource``, e.g. "status",
        which changes that part only)."""
        ...

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None: ...

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: dict[str, str] | None = None,
    ) -> None: ...

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """Evict the pod (``pods/eviction``, policy/v1) if its UID is still ``uid``: the
        API server deletes it gracefully, or refuses with 429 while a
        PodDisruptionBudget does not allow it."""
        ...
