"""What code under test logged, as an operator would read it."""

from __future__ import annotations

import pytest


def logged(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The messages ``logger`` logged so far in the test, formatted, in order."""
    return [r.getMessage() for r in caplog.records if r.name == logger]
