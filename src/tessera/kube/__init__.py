"""Kubernetes adapter: one small port (``KubeApi``), the real client and an in-memory fake.

* ``KubeApi`` (port.py): list / watch / get / create / replace / merge_patch / delete /
  bind over plain JSON dicts, with resourceVersion and UID preconditions.
* ``KubeClient`` (client.py): the API server, configured from kubeconfig or in-cluster.
* ``FakeKube`` (fake.py): the same contract in memory, for unit tests.
* ``Reflector`` (reflector.py): list + watch into a handler, re-listing on 410 Gone.
* ``EventRecorder`` (events.py): core/v1 Events on an object, deduplicated.
* ``AioBinder`` / ``ThreadedBinder`` (binder.py): the pods/binding write awaited from an
  event loop (the extender's bind), through aiohttp or a thread pool.
* Errors (errors.py): ``ApiError`` and its ``NotFound`` / ``Conflict`` / ``Gone`` /
  ``Unavailable``.

Nothing here knows Tessera's annotations or placement; the scheduler and the node agent
build on it.
"""

from tessera.kube.errors import ApiError, Conflict, Gone, NotFound, Unavailable
from tessera.kube.events import EventRecorder
from tessera.kube.fake import FakeKube
from tessera.kube.kinds import EVENTS, GPUQUOTAS, LEASES, NODES, PODS, Kind
from tessera.kube.port import KubeApi, ListResult, Obj, WatchEvent
from tessera.kube.reflector import Reflector, ReflectorHandler

__all__ = [
    "EVENTS",
    "GPUQUOTAS",
    "LEASES",
    "NODES",
    "PODS",
    "ApiError",
    "Conflict",
    "EventRecorder",
    "FakeKube",
    "Gone",
    "Kind",
    "KubeApi",
    "ListResult",
    "NotFound",
    "Obj",
    "Reflector",
    "ReflectorHandler",
    "Unavailable",
    "WatchEvent",
]
