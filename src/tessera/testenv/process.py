"""Start, watch and stop the control plane's processes; free ports; health checks.

Each process runs in its own session (process group) with its output in a log file, so
stopping it stops everything it started. With ``tied=True`` the process also gets
``PR_SET_PDEATHSIG``: the kernel kills it when the Python process that started it dies,
even by SIGKILL, so a test run that is interrupted or killed leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tessera.testenv.errors import StartError

__all__ = [
    "Process",
    "free_port",
    "kill_group",
    "log_tail",
    "pid_alive",
    "port_in_use",
    "wait_http",
]

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


_LISTEN_FLOOR = 10000  # listening ports are drawn from here up to the ephemeral range
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def _ephemeral_floor(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    """The lowest port the kernel gives outgoing connections (32768 if it cannot say)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now, never the same twice in
    one process.

    It is drawn below the kernel's ephemeral range: a port from that range can become
    the source port of any outgoing connection between this call and the component's
    own bind, and a busy control plane opens thousands (a kubelet once failed with
    "bind: address already in use" that way). Where that range starts too low to leave
    room, the kernel picks (port 0), as before.
    """
    floor = _ephemeral_floor()
    with _handed_out_lock:
        for _ in range(200 if floor - _LISTEN_FLOOR >= 1000 else 0):
            port = random.randrange(_LISTEN_FLOOR, floor)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((LOOPBACK, port))
                except OSError:
                    continue  # someone listens (or just did) there
            _handed_out.add(port)
            return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, 0))
            chosen: int = s.getsockname()[1]
        _handed_out.add(chosen)
        return chosen


def port_in_use(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((LOOPBACK, port)) == 0


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file, indented, for error messages."""
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        return f"    (no log: {exc})"
    return "\n".join("    " + line for line in text) or "    (log is empty)"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie of ours still answers kill(0); look at its state.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_group(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group led by ``pid``; SIGKILL it if it is not gone in time."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _reap(pid)
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _tie_to_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Process:
    """One running component: its name, command, log file and pid."""

    name: str
    argv: list[str]
    log: Path
    pid: int = 0
    _popen: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls, name: str, argv: list[str], log: Path, tied: bool, env: dict[str, str] | None = None
    ) -> Process:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            out.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            out.flush()
            try:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_tie_to_parent if tied else None,
                    close_fds=True,
                    env=env,
                )
            except OSError as exc:
                raise StartError(name, f"cannot run {argv[0]}: {exc}", str(log)) from exc
        return cls(name=name, argv=argv, log=log, pid=popen.pid, _popen=popen)

    def exit_code(self) -> int | None:
        """None while running; the exit code once it has exited."""
        if self._popen is not None:
            return self._popen.poll()
        return None if pid_alive(self.pid) else -1

    def alive(self) -> bool:
        return self.exit_code() is None

    def stop(self, timeout: float = 10.0) -> None:
        if self.pid and self.alive():
            kill_group(self.pid, timeout)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=1)

    def fail(self, message: str) -> StartError:
        """A StartError for this component whose message ends with its log's tail."""
        return StartError(
            self.name, f"{message}\n  log {self.log}:\n{log_tail(self.log)}", str(self.log)
        )


def wait_http(
    proc: Process,
    url: str,
    timeout: float,
    context: ssl.SSLContext | None = None,
    ok: Callable[[int, bytes], bool] = lambda status, _body: status == 200,
) -> None:
    """Poll ``url`` until ``ok`` says yes; raise StartError naming the cause otherwise."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while True:
        code = proc.exit_code()
        if code is not None:
            raise proc.fail(f"exited with code {code} before it became healthy")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as resp:
                body = resp.read()
                if ok(resp.status, body):
                    return
                last = f"HTTP {resp.status}: {body[:300]!r}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:300]!r}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            raise proc.fail(f"not healthy after {timeout:.0f} s at {url} (last: {last})")
        time.sleep(0.2)
