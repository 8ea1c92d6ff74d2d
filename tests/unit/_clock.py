"""A clock a test moves by hand: pass it where the code takes a ``clock`` callable."""

from __future__ import annotations


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
