"""Process supervision without a cluster: ports, logs, process groups, health waits."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from tessera.testenv.errors import StartError
from tessera.testenv.process import (
    Process,
    _ephemeral_floor,
    free_port,
    log_tail,
    pid_alive,
    port_in_use,
    wait_http,
)


def test_free_port_is_free_and_port_in_use_sees_a_listener() -> None:
    port = free_port()
    assert not port_in_use(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert port_in_use(port)


def test_free_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    # An ephemeral port may become an outgoing connection's source port before the
    # component binds it; one below the range cannot.
    floor = _ephemeral_floor()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    if floor - 10000 >= 1000:
        assert all(10000 <= p < floor for p in ports), (floor, ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # each is bindable now


def test_the_ephemeral_floor_is_read_from_the_kernel_and_defaults(tmp_path: Path) -> None:
    table = tmp_path / "ip_local_port_range"
    table.write_text("40000\t60999\n")
    assert _ephemeral_floor(table) == 40000
    assert _ephemeral_floor(tmp_path / "missing") == 32768


def test_log_tail_keeps_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    tail = log_tail(log, 3)
    assert tail.splitlines() == ["    line 47", "    line 48", "    line 49"]
    assert "no log" in log_tail(tmp_path / "missing.log")


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    # The child starts a grandchild; stopping the child must take both.
    code = (
        "import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
        "print(p.pid, flush=True); time.sleep(60)"
    )
    proc = Process.start("t", [sys.executable, "-c", code], tmp_path / "t.log", tied=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len((tmp_path / "t.log").read_text().splitlines()) < 2:
        time.sleep(0.05)
    grandchild = int((tmp_path / "t.log").read_text().splitlines()[-1])
    assert pid_alive(grandchild)
    proc.stop()
    assert not proc.alive()
    deadline = time.monotonic() + 5
    while pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(grandchild)


def test_wait_http_reports_early_exit_with_log_tail(tmp_path: Path) -> None:
    code = "import sys; print('boom: address already in use'); sys.exit(3)"
    proc = Process.start("comp", [sys.executable, "-c", code], tmp_path / "c.log", tied=True)
    with pytest.raises(StartError) as err:
        wait_http(proc, f"http://127.0.0.1:{free_port()}/healthz", timeout=10)
    msg = str(err.value)
    assert msg.startswith("comp: exited with code 3")
    assert "address already in use" in msg


def test_wait_http_times_out_naming_url_and_cause(tmp_path: Path) -> None:
    proc = Process.start(
        "slow", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "s.log", tied=True
    )
    url = f"http://127.0.0.1:{free_port()}/readyz"
    try:
        with pytest.raises(StartError, match=r"slow: not healthy after 1 s at .*/readyz"):
            wait_http(proc, url, timeout=1)
    finally:
        proc.stop()


def test_missing_binary_is_a_start_error(tmp_path: Path) -> None:
    with pytest.raises(StartError, match="cannot run /nonexistent/etcd"):
        Process.start("etcd", ["/nonexistent/etcd"], tmp_path / "e.log", tied=True)
