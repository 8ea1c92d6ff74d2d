"""Errors of the test environment. Each message says what failed and where to look.

TesseraError
└── TestEnvError        the local control plane could not be built, started or used
    ├── BuildError      a Go toolchain is missing or `go build` failed (carries the log)
    └── StartError      a component did not come up: exited, port taken, not healthy
"""

from __future__ import annotations

from tessera.errors import TesseraError

__all__ = ["BuildError", "StartError", "TestEnvError"]


class TestEnvError(TesseraError):
    """Base of the test environment's errors."""

    __test__ = False  # not a pytest test class despite the name


class BuildError(TestEnvError):
    """Building a component from its Go module failed. ``log`` is the build log's path."""

    def __init__(self, message: str, log: str | None = None) -> None:
        self.log = log
        super().__init__(message)


class StartError(TestEnvError):
    """A component did not start. ``component`` names it, ``log`` is its log's path."""

    def __init__(self, component: str, message: str, log: str | None = None) -> None:
        self.component = component
        self.log = log
        super().__init__(f"{component}: {message}")
