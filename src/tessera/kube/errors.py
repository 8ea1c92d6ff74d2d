"""Errors of the Kubernetes adapter: API answers translated once, at the boundary.

TesseraError
└── ApiError              the API server refused a call, or could not be reached
    ├── NotFound          404: the object does not exist (or no longer does)
    ├── Conflict          409: a resourceVersion / UID precondition failed, or it exists
    ├── Gone              410: a watch's resourceVersion is too old; list again
    └── Unavailable       no answer: connection refused, reset or timed out
        └── NotSent       no request went out: no connection, or no credentials
KubeconfigError           the kubeconfig (or the in-cluster config) does not load

Every ApiError carries ``status`` (HTTP code, 0 when no answer), ``reason`` (the
Status object's reason, e.g. "Conflict") and the server's message.
"""

from __future__ import annotations

import json

from tessera.errors import TesseraError

__all__ = [
    "MANY_BUDGETS",
    "ApiError",
    "Conflict",
    "Gone",
    "KubeconfigError",
    "NotFound",
    "NotSent",
    "Unavailable",
    "error_from_status",
    "outcome_unknown",
]


class ApiError(TesseraError):
    """The API server refused a call. ``status`` is the HTTP code (0: no answer)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}")


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: precondition failed (resourceVersion, UID) or the object already exists."""


class Gone(ApiError):
    """410: the resourceVersion a watch started from is no longer kept; list again."""


class Unavailable(ApiError):
    """No answer from the API server."""


class NotSent(Unavailable):
    """No request went out (no connection could be made, or the credentials could not
    be read now): retried as any Unavailable, but nothing it would have written can have
    landed."""


class KubeconfigError(TesseraError):
    """No client could be made: the message names the kubeconfig and why it does not
    load (a missing file, no such context, no in-cluster config)."""


# The Eviction API refuses a pod that more than one PodDisruptionBudget covers with a
# 500 and these words (a plain error in kube-apiserver's pod eviction REST, no reason;
# v1.36, read from the real server in tests/e2e/test_kube_fake_vs_real.py): a definite
# no, though a 500.
MANY_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, which the eviction "
    "subresource does not support."
)


def outcome_unknown(exc: ApiError) -> bool:
    """Whether a failed write may have landed all the same: no answer at all (the request
    may have reached the server), a 504 (the server gave up waiting, the handler may go
    on), or a 500 (e.g. "etcdserver: request timed out", after which the transaction may
    still commit) but the eviction's refusal of a pod two budgets cover. A 4xx, a 409
    that was read and understood, or a request never sent, is a definite no."""
    if isinstance(exc, NotSent) or (exc.status == 500 and exc.message == MANY_BUDGETS):
        return False
    return isinstance(exc, Unavailable) or exc.status in (500, 504)


_BY_STATUS: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Gone}


def error_from_status(status: int, body: bytes | str | dict[str, object] | None) -> ApiError:
    """The ApiError for an HTTP status and a (possibly empty) metav1.Status body."""
    reason, message = "", ""
    obj: object = body
    if isinstance(body, bytes | str):
        try:
            obj = json.loads(body)
        except ValueError:
            text = body.decode(errors="replace") if isinstance(body, bytes) else body
            obj, message = None, text.strip()[:500]
    if isinstance(obj, dict):
        reason = str(obj.get("reason") or "")
        message = str(obj.get("message") or message)
        code = obj.get("code")
        if isinstance(code, int) and status == 200:  # a Status inside a watch stream
            status = code
    cls = _BY_STATUS.get(status, ApiError)
    return cls(status, reason or cls.__name__, message)
