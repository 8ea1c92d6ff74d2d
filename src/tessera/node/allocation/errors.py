"""The one error of the allocation path, carrying the gRPC status kubelet gets."""

from __future__ import annotations

from tessera.node.pods import PodInfo

__all__ = ["FAILED_PRECONDITION", "INVALID_ARGUMENT", "NOT_FOUND", "AllocationError"]

INVALID_ARGUMENT = "INVALID_ARGUMENT"
FAILED_PRECONDITION = "FAILED_PRECONDITION"
NOT_FOUND = "NOT_FOUND"


class AllocationError(Exception):
    """A call kubelet made cannot be answered; ``code`` is the gRPC status to return and
    ``pod``, when known, gets a Warning Event with the same message."""

    def __init__(self, code: str, message: str, pod: PodInfo | None = None) -> None:
        self.code = code
        self.message = message
        self.pod = pod
        super().__init__(message)
