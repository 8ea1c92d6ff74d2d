"""What every unit test gets: a watch handler that raised fails the test.

A reflector whose handler raises logs it and lists again (kube/reflector.py): the view
heals itself, so a bug in how one event is applied goes unseen by a test that only looks
at the state afterwards. Here such a failure fails the test that caused it, unless the
test is marked ``handler_fails`` (the reflector's own tests of that path).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

REFLECTOR_LOG = "tessera.kube.reflector"
HANDLER_FAILED = "handler failed"


class _HandlerFailures(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if HANDLER_FAILED in record.getMessage():
            self.seen.append(f"{record.getMessage()}\n{self.format(record)}")


@pytest.fixture(autouse=True)
def no_watch_handler_fails(request: pytest.FixtureRequest) -> Iterator[None]:
    failures = _HandlerFailures()
    failures.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(REFLECTOR_LOG)
    logger.addHandler(failures)
    try:
        yield
    finally:
        logger.removeHandler(failures)
    if failures.seen and request.node.get_closest_marker("handler_fails") is None:
        pytest.fail("a watch handler raised (the reflector listed again):\n" + failures.seen[0])
