"""A real node beside the kwok ones: the kubelet built from the testenv's Kubernetes
module, containerd and runc from Debian, images imported from local OCI archives.

Why it looks the way it does (docs/testenv.md, "The real node"):

* kubelet and containerd 1.6 use fixed paths (/var/lib/kubelet, /var/log/pods,
  /var/log/containers, /run/containerd, /run/netns). Every process of the node runs in
  one private mount namespace, held by a small ``holder`` process, with a tmpfs on each
  of those paths; ``nsenter`` starts (and restarts) containerd, kubelet and the node
  agent inside it. Files the host needs (containerd's root, the node agent's state, the
  logs) live in the state folder, outside the tmpfs mounts, and so are the same paths
  inside and out. From the host, a path inside is ``/proc/<holder>/root/<path>``.
* cgroup v1 hybrid: ``failCgroupV1: false`` and ``cgroupDriver: cgroupfs``, under a
  private ``cgroupRoot``; containerd and its shims run in a cgroup beside the pods, so
  stopping the node kills every process of it.
* runc cannot set the OOM score of a container's init without CAP_SYS_RESOURCE, which
  root here lacks: containerd's CRI plugin gets ``restrict_oom_score_adj = true``.
* kubelet rewrites ``vm.overcommit_memory``, ``kernel.panic`` and ``kernel.panic_on_oops``
  when it starts: they are saved first and restored as soon as the node is Ready, and
  again when it stops. kubelet runs with a PATH without /usr/sbin and /sbin, so it finds
  no iptables and adds no chains. The CNI bridge has ``isGateway: false`` and no IP
  masquerade, so ip_forward and the host's routes are left alone; the tests' pods use
  the host network and never touch it.
* The API server reaches a kubelet by the node's name (kubelet refuses a loopback
  ``--node-ip``), so the node is called ``localhost`` unless told otherwise; it presents a
  client certificate of the testenv CA, and the kubelet serves with one of the same CA.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tessera.kube import NODES, ApiError
from tessera.testenv import config as cfg
from tessera.testenv.certs import CertPair
from tessera.testenv.errors import TestEnvError
from tessera.testenv.images import PAUSE_IMAGE
from tessera.testenv.process import Process, free_port, pid_alive

if TYPE_CHECKING:
    from tessera.kube.client import KubeClient
    from tessera.testenv.env import TestEnv

__all__ = ["CGROUP_ROOT_PREFIX", "SYSCTLS", "RealNode", "missing_prerequisites"]

CGROUP_V1 = Path("/sys/fs/cgroup")
CGROUP_ROOT_PREFIX = "tessera-node-"
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
# Fixed paths of kubelet and containerd 1.6, each a tmpfs in the node's mount namespace.
PRIVATE_MOUNTS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/netns",
)
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
STATE_FILE = "realnode.json"
# kubelet finds mount, umount, nsenter ... here; not iptables (in /usr/sbin).
NODE_PATH = "/usr/local/bin:/usr/bin:/bin"


def missing_prerequisites() -> list[str]:
    """What this machine lacks to run a real node (empty: it can)."""
    out = []
    if os.geteuid() != 0:
        out.append("root (kubelet and containerd manage mounts and cgroups)")
    for tool, package in (
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
    ):
        if shutil.which(tool, path=NODE_PATH + ":/usr/sbin:/sbin") is None:
            out.append(f"{tool} (apt-get install {package})")
    if not Path("/usr/lib/cni/bridge").exists():
        out.append("CNI plugins in /usr/lib/cni (apt-get install containernetworking-plugins)")
    if not (CGROUP_V1 / "memory").is_dir():
        out.append("cgroup v1 hierarchies under /sys/fs/cgroup (this node setup is for v1 hybrid)")
    return out


def _hierarchies() -> list[Path]:
    return (
        sorted(p for p in CGROUP_V1.iterdir() if p.is_dir() and p.name != "unified")
        if CGROUP_V1.is_dir()
        else []
    )


class RealNode:
    """One real node of a running ``TestEnv``. ``RealNode.start(env, ...)``; ``stop()``."""

    def __init__(
        self, env: TestEnv, state_dir: Path, name: str, tied: bool, containerd: Path | None = None
    ) -> None:
        self.env = env
        # None: Debian's containerd (1.6) from PATH; or a built one (1.7: applies CDI).
        self.containerd = containerd
        self.state_dir = state_dir
        self.name = name
        self.tied = tied
        self.cgroup_root = f"/{CGROUP_ROOT_PREFIX}{name}"
        self.logs = state_dir / "logs"
        self.processes: dict[str, Process] = {}
        self.ports: dict[str, int] = {}
        self._sysctls: dict[str, str] = {}
        self._api: KubeClient | None = None

    # ---- paths -----------------------------------------------------------------------

    @property
    def holder_pid(self) -> int:
        return self.processes["holder"].pid

    def inside(self, path: str) -> Path:
        """A path of the node's mount namespace, as the host reaches it."""
        return Path(f"/proc/{self.holder_pid}/root{path}")

    def nsenter(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the node's mount namespace."""
        return ["nsenter", f"--mount=/proc/{self.holder_pid}/ns/mnt", "--", *argv]

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    @property
    def cdi_dir(self) -> Path:
        """Where a built containerd reads CDI specs (Debian's 1.6 reads none)."""
        return self.state_dir / "cdi"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubelet.kubeconfig"

    # ---- lifecycle -------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        env: TestEnv,
        state_dir: Path | str,
        *,
        name: str = "localhost",
        images: Iterable[Path] = (),
        tied: bool = True,
        timeout: float = 120.0,
        containerd: Path | None = None,
    ) -> RealNode:
        """Start containerd and kubelet, import the images, wait until the node is Ready.

        ``images``: OCI archives to import besides the pause image (``images.build_*``).
        ``containerd``: a containerd binary to run instead of Debian's (its shim beside
        it), e.g. ``ensure_binaries(["containerd"])["containerd"]`` (1.7, with CDI on and
        specs read from ``cdi_dir``).
        On any failure whatever was started is stopped before the error propagates.
        """
        missing = missing_prerequisites()
        if missing:
            raise TestEnvError("cannot start a real node; missing: " + "; ".join(missing))
        node = cls(env, Path(state_dir).resolve(), name, tied, containerd)
        try:
            node._start(list(images), timeout)
        except BaseException:
            node.stop()
            raise
        return node

    def _start(self, images: list[Path], timeout: float) -> None:
        from tessera.testenv.images import build_pause

        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._clean_cgroups()  # a node of the same name killed without stop()
        for root in self._cgroup_roots():
            for d in (root, root / "runtime"):
                d.mkdir(parents=True, exist_ok=True)
                if root.parent.name == "cpuset":  # a new cpuset takes no task without cpus/mems
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (d / f).write_text((d.parent / f).read_text())
        self._write_configs()
        self._start_holder(timeout)
        self.start_containerd(timeout)
        pause = build_pause(self.state_dir / "images")
        for archive in (pause, *images):
            self.import_image(archive)
        self._sysctls = {k: Path("/proc/sys", k).read_text().strip() for k in SYSCTLS}
        self._save_state()
        self.start_kubelet(timeout)

    def _start_holder(self, timeout: float) -> None:
        ready = self.state_dir / "namespace-ready"
        ready.unlink(missing_ok=True)
        mounts = " && ".join(
            f"mkdir -p {p} && mount -t tmpfs -o mode=0755 tessera-node {p}" for p in PRIVATE_MOUNTS
        )
        script = f"set -e; {mounts}; touch {ready}; exec sleep 2147483647"
        argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script]
        proc = Process.start("holder", argv, self.log("holder"), self.tied)
        self.processes["holder"] = proc
        self._save_state()
        _wait(lambda: ready.exists(), timeout, proc, "the node's mount namespace")

    def start_containerd(self, timeout: float = 60.0) -> None:
        """Start (or start again) containerd in the node's namespace and cgroup."""
        binary = str(self.containerd or "containerd")
        argv = self.nsenter([binary, "--config", str(self.state_dir / "containerd.toml")])
        env = None
        if self.containerd is not None:  # it starts the shim it finds first on PATH
            env = dict(os.environ, PATH=f"{self.containerd.parent}:{os.environ['PATH']}")
        proc = Process.start("containerd", argv, self.log("containerd"), self.tied, env=env)
        self.processes["containerd"] = proc
        self._save_state()
        self._join_runtime_cgroup(proc.pid)
        sock = self.inside(CONTAINERD_SOCKET)
        _wait(
            lambda: sock.exists() and self._ctr(["version"], check=False) == 0,
            timeout,
            proc,
            "containerd",
        )

    def start_kubelet(self, timeout: float = 90.0) -> None:
        """Start (or start again) the kubelet and wait until the node is Ready."""
        if self.env.binaries is None:
            raise TestEnvError("starting a kubelet needs the environment that built it")
        argv = self.nsenter(
            [
                str(self.env.binaries["kubelet"]),
                f"--config={self.state_dir / 'kubelet.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--hostname-override={self.name}",
                "--v=1",
            ]
        )
        env = dict(os.environ, PATH=NODE_PATH)
        proc = Process.start("kubelet", argv, self.log("kubelet"), self.tied, env=env)
        self.processes["kubelet"] = proc
        self._save_state()
        _wait(self.ready, timeout, proc, f"node {self.name} to be Ready")
        self._restore_sysctls()

    def ready(self) -> bool:
        """Whether the API server shows the node Ready."""
        from tessera.kube.client import KubeClient

        if self._api is None:
            self._api = KubeClient.from_kubeconfig(str(self.env.kubeconfig))
        try:
            node = self._api.get(NODES, self.name)
        except ApiError:
            return False
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def stop_process(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        if proc is not None:
            proc.stop()

    def restart_kubelet(self) -> None:
        self.stop_process("kubelet")
        self.start_kubelet()

    def restart_containerd(self) -> None:
        self.stop_process("containerd")
        self.start_containerd()

    def stop(self) -> None:
        """Stop kubelet, every container and containerd; remove cgroups; restore sysctls."""
        for name in ("kubelet", "containerd"):
            self.stop_process(name)
        self._clean_cgroups()
        self.stop_process("holder")
        self._restore_sysctls()
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    @classmethod
    def attach(cls, env: TestEnv, state_dir: Path | str) -> RealNode:
        """The node recorded in ``state_dir`` by another process (``tessera dev-cluster``)."""
        state_dir = Path(state_dir).resolve()
        try:
            state = json.loads((state_dir / STATE_FILE).read_text())
        except FileNotFoundError:
            raise TestEnvError(f"no real node in {state_dir} (no {STATE_FILE})") from None
        built = state.get("containerd")
        node = cls(env, state_dir, state["name"], tied=False, containerd=built and Path(built))
        node._sysctls = dict(state["sysctls"])
        for name, pid in state["pids"].items():
            if pid_alive(int(pid)):
                node.processes[name] = Process(name, [], node.log(name), int(pid))
        return node

    def _save_state(self) -> None:
        state = {
            "name": self.name,
            "pids": {n: p.pid for n, p in self.processes.items()},
            "sysctls": self._sysctls,
            "containerd": str(self.containerd) if self.containerd else None,
        }
        (self.state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    # ---- containerd ------------------------------------------------------------------

    def _ctr(self, args: list[str], check: bool = True) -> int:
        argv = [
            "ctr",
            "--address",
            str(self.inside(CONTAINERD_SOCKET)),
            "--namespace",
            "k8s.io",
            *args,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        if check and done.returncode != 0:
            raise TestEnvError(
                f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done.returncode

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into containerd's CRI namespace (unpacked, ready to run)."""
        self._ctr(["images", "import", "--all-platforms", str(archive)])

    # ---- cgroups and sysctls ---------------------------------------------------------

    def _cgroup_roots(self) -> list[Path]:
        """The node's cgroup root in every v1 hierarchy."""
        return [h / self.cgroup_root.lstrip("/") for h in _hierarchies()]

    def _join_runtime_cgroup(self, pid: int) -> None:
        for root in self._cgroup_roots():
            with contextlib.suppress(OSError):
                (root / "runtime" / "cgroup.procs").write_text(str(pid))

    def _clean_cgroups(self) -> None:
        """Kill every process under the node's cgroup root, then remove its cgroups."""
        roots = [r for r in self._cgroup_roots() if r.is_dir()]
        for _ in range(50):
            pids = {
                int(p) for r in roots for d in _walk(r) for p in _read(d / "cgroup.procs").split()
            }
            pids.discard(os.getpid())
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for r in roots:
            for d in sorted(_walk(r), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            path = Path("/proc/sys", key)
            with contextlib.suppress(OSError):
                if path.read_text().strip() != value:
                    path.write_text(value)

    # ---- configuration files ---------------------------------------------------------

    def _write_configs(self) -> None:
        ca = self.env.ca
        client = ca.issue("kubelet-" + self.name, f"system:node:{self.name}", ("system:nodes",))
        serving = ca.issue(
            "kubelet-serving-" + self.name,
            self.name,
            hosts=("127.0.0.1", "localhost", self.name),
            client=False,
            server=True,
        )
        cfg.write_yaml(
            self.kubeconfig, cfg.kubeconfig(self.env.server, ca.cert_path, client.cert, client.key)
        )
        for p in ("kubelet", "healthz"):
            self.ports[p] = free_port()
        (self.state_dir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "cni" / "net.d" / "10-tessera.conflist").write_text(
            json.dumps(self._cni_config(), indent=2) + "\n"
        )
        (self.state_dir / "containerd.toml").write_text(self._containerd_config())
        cfg.write_yaml(self.state_dir / "kubelet.yaml", self._kubelet_config(ca.cert_path, serving))

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "0.4.0",
            "name": "tessera-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "tsnode0",
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": "10.254.254.0/24"}]],
                        "dataDir": str(self.state_dir / "cni" / "ipam"),
                    },
                }
            ],
        }

    def _containerd_config(self) -> str:
        s = self.state_dir
        return f"""version = 2
root = "{s / "containerd"}"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{s / "containerd-opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # runc cannot lower the OOM score of a container's init without CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  enable_selinux = false{self._cdi_config()}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{shutil.which("runc", path="/usr/sbin:/usr/bin") or "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{s / "cni" / "net.d"}"
"""

    def _cdi_config(self) -> str:
        if self.containerd is None:
            return ""  # 1.6 has no CDI
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        return f"""
  enable_cdi = true
  cdi_spec_dirs = ["{self.cdi_dir}"]"""

    def _kubelet_config(self, ca_cert: Path, serving: CertPair) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.ports["healthz"],
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {
                "x509": {"clientCAFile": str(ca_cert)},
                "webhook": {"enabled": False},
                "anonymous": {"enabled": False},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            "failSwapOn": False,
            "resolvConf": "",
            "registerNode": True,
            "serializeImagePulls": False,
            "localStorageCapacityIsolation": False,
            # Never evict or collect images on a test machine's disk: the images are local.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "syncFrequency": "10s",
        }


def _walk(root: Path) -> list[Path]:
    out = [root]
    with contextlib.suppress(OSError):
        for d in root.iterdir():
            if d.is_dir():
                out += _walk(d)
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _wait(pred: Callable[[], bool], timeout: float, proc: Process, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        code = proc.exit_code()
        if code is not None:
            raise proc.fail(f"exited with code {code} while waiting for {what}")
        if time.monotonic() > deadline:
            raise proc.fail(f"no {what} after {timeout:.0f} s")
        time.sleep(0.1)
