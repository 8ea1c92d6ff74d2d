"""Two replicas on the real API, one Lease: the standby answers nothing that reserves or
writes; a leader stopped cleanly hands over at once; a leader SIGKILLed is replaced once
its Lease expires."""

from __future__ import annotations

import json
import time

import pytest

from tessera.testenv.process import free_port
from tests.e2e.scheduler.harness import Extender, Harness
from tests.e2e.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _ready(e: Extender) -> int:
    return e.get("/readyz")[0]


def test_standby_then_handover_then_takeover_after_a_crash(harness: Harness) -> None:
    first = harness.extender
    assert first is not None and _ready(first) == 200
    second = Extender(first.workdir, first.kubeconfig, free_port(), free_port(), first.cert,
                      first.key)  # fmt: skip
    second.starts = 10  # its own log files
    try:
        # start() waits for /readyz 200, which a standby never gives: start by hand.
        second.start_standby()
        wait_for("the standby to sync", lambda: second.get("/readyz") == (503, b"standby"), 30)
        body = json.dumps({"Pod": {"metadata": {"name": "x"}}, "NodeNames": []}).encode()
        for verb in ("filter", "prioritize", "bind"):
            status, answer = second.request("POST", f"/{verb}", body)
            assert status == 503 and b"standby" in answer, (verb, status, answer)
        assert second.metric("tessera_scheduler_leader") == 0

        # A clean stop releases the Lease: the standby leads within a retry period.
        start = time.monotonic()
        first.stop()
        wait_for("the standby to lead", lambda: _ready(second) == 200, 10)
        handover = time.monotonic() - start
        assert second.metric("tessera_scheduler_leader") == 1

        # The first comes back as standby; the leader is SIGKILLed (no release): the
        # standby takes over once the Lease (15 s) has not been renewed.
        first.start_standby()
        wait_for("the first to stand by", lambda: first.get("/readyz") == (503, b"standby"), 30)
        start = time.monotonic()
        second.kill()
        wait_for("the first to lead again", lambda: _ready(first) == 200, 30)
        takeover = time.monotonic() - start
        assert 10 < takeover < 25, takeover
        assert handover < 5, handover
    finally:
        second.stop()
        if _ready(first) != 200:  # leave the harness as it found it
            first.stop()
            first.start()
