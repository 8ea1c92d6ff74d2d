"""Polling for the e2e tests: the control plane is eventually consistent."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 60.0,
    every: float = 0.1,
    explain: Callable[[], str] | None = None,
) -> Any:
    """``check()``'s first truthy value; fails the test naming ``what`` after ``timeout``
    (with ``explain()``'s account of the state, when given)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(every)
