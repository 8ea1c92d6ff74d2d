"""What code under test logged, as an operator would read it."""

from __future__ import annotations

import pytest


def logged(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The messages ``logger`` logged so far in the test, formatted, in order."""
    return [r.getMessage() for r in caplog.records if r.name == logger]


def logged_levels(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[str, str]]:
    """(level, message) of each line ``logger`` logged so far in the test, in order."""
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == logger]
