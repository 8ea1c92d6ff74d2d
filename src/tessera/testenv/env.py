"""``TestEnv``: a real Kubernetes control plane on 127.0.0.1, started and stopped from Python.

Components, in start order (each on free loopback ports, each waited for):

1. etcd (plain HTTP on loopback, fsync off: a throwaway store);
2. kube-apiserver (TLS with a generated CA, client-certificate auth, RBAC + Node authz);
3. kube-controller-manager (namespaces, service accounts, garbage collection, workloads);
4. kube-scheduler (leader election off; its config may name extenders);
5. kwok (fake kubelets for nodes annotated ``kwok.x-k8s.io/node=fake``).

Everything lives in one state directory: certificates, kubeconfigs, configs, logs and
``state.json`` (pids and ports), so another process (``tessera dev-cluster status|down``)
can find and stop it. ``stop()`` leaves no process and no listening port behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tessera.model.names import ResourceNames
from tessera.model.types import NodeInventory
from tessera.testenv import config as cfg
from tessera.testenv.build import Binaries, ensure_binaries, testenv_dir
from tessera.testenv.certs import CertificateAuthority, CertPair, write_signing_key
from tessera.testenv.errors import StartError, TestEnvError
from tessera.testenv.nodes import KWOK_SELECTOR, node_manifest
from tessera.testenv.process import (
    LOOPBACK,
    Process,
    free_port,
    kill_group,
    log_tail,
    pid_alive,
    port_in_use,
    wait_http,
)

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = ["TestEnv"]

SchedulerConfig = Mapping[str, Any] | Path | str | None
Progress = Callable[[str], None]

STATE_FILE = "state.json"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
_PORT_RETRIES = 3
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


class TestEnv:
    """A running control plane. Use ``TestEnv.start(...)``; stop with ``stop()`` or ``with``."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, state_dir: Path, binaries: Binaries | None, tied: bool) -> None:
        self.state_dir = state_dir
        self.binaries = binaries
        self.tied = tied
        self.ports: dict[str, int] = {}
        self.processes: dict[str, Process] = {}
        self._pids: dict[str, int] = {}
        self._scheduler_config: dict[str, Any] = {}
        self.pki = state_dir / "pki"
        self.logs = state_dir / "logs"
        self.kubeconfig = state_dir / "kubeconfig"
        self._ca: CertificateAuthority | None = None

    # ---- starting -----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        state_dir: Path | str,
        *,
        scheduler_config: SchedulerConfig = None,
        controller_manager: bool = True,
        tied: bool = True,
        binaries: Binaries | None = None,
        timeout: float = 90.0,
        progress: Progress | None = None,
    ) -> TestEnv:
        """Build (or reuse) the binaries and start the control plane in ``state_dir``.

        ``scheduler_config``: a KubeSchedulerConfiguration dict or YAML file (see
        ``config.scheduler_config``; build extender entries with ``config.extender``).
        ``tied``: the processes die with this Python process (tests); ``False`` for a
        long-lived dev cluster. ``timeout``: seconds each component gets to be healthy.
        On any failure, whatever was started is stopped before the error propagates.
        """
        say = progress or (lambda _msg: None)
        state_dir = Path(state_dir).resolve()
        existing = _running_pids(state_dir)
        if existing:
            raise StartError(
                "testenv",
                f"an environment is already running in {state_dir} (pids "
                f"{', '.join(f'{n}={p}' for n, p in existing.items())}); stop it first",
            )
        if binaries is None:
            wanted = ["etcd", "kubernetes", "kwok"]
            binaries = ensure_binaries(wanted, progress=say)
        state_dir.mkdir(parents=True, exist_ok=True)
        env = cls(state_dir, binaries, tied)
        started = time.monotonic()
        try:
            env._prepare()
            env._start_etcd(timeout)
            env._start_apiserver(timeout, taint_new_nodes=controller_manager)
            if controller_manager:
                env._start_controller_manager(timeout)
                env._wait_default_service_account(timeout)
            env._write_scheduler_config(scheduler_config)
            env._start_scheduler(timeout)
            env._start_kwok(timeout)
        except BaseException:
            env.stop()
            raise
        say(f"control plane up in {time.monotonic() - started:.1f} s; kubeconfig: {env.kubeconfig}")
        return env

    @classmethod
    def attach(cls, state_dir: Path | str) -> TestEnv:
        """The environment recorded in ``state_dir`` (started by another process)."""
        state_dir = Path(state_dir).resolve()
        try:
            state = json.loads((state_dir / STATE_FILE).read_text())
        except FileNotFoundError:
            raise TestEnvError(f"no environment in {state_dir} (no {STATE_FILE})") from None
        env = cls(state_dir, None, tied=False)
        env.ports = {k: int(v) for k, v in state.get("ports", {}).items()}
        env._pids = {k: int(v) for k, v in state.get("pids", {}).items()}
        return env

    def _prepare(self) -> None:
        # A fresh store and fresh identities each start; logs are appended to.
        for sub in ("etcd-data", "pki", "kubeconfigs"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "kubeconfigs").mkdir()
        self._ca = CertificateAuthority(self.pki)
        ca = self._ca
        hosts = (
            LOOPBACK,
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "10.96.0.1",
        )
        self._serving = ca.issue(
            "apiserver", "kube-apiserver", hosts=hosts, client=False, server=True
        )
        self._components_serving = ca.issue(
            "components",
            "tessera-testenv-components",
            hosts=(LOOPBACK, "localhost"),
            client=False,
            server=True,
        )
        self._sa = write_signing_key(self.pki)
        identities = {
            "admin": ("tessera-admin", ("system:masters",)),
            "kube-scheduler": ("system:kube-scheduler", ()),
            "kube-controller-manager": ("system:kube-controller-manager", ()),
            # kwok acts for every fake node (it patches node and pod status, renews leases):
            # the Node authorizer admits one node per identity, so kwok gets admin rights.
            "kwok": ("kwok", ("system:masters",)),
            # The API server's client identity towards real kubelets (logs, exec).
            "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ()),
        }
        self._clients = {
            name: ca.issue(name, cn, groups) for name, (cn, groups) in identities.items()
        }

    def _write_kubeconfigs(self) -> None:
        for name, pair in self._clients.items():
            path = self.kubeconfig if name == "admin" else self._component_kubeconfig(name)
            cfg.write_yaml(
                path, cfg.kubeconfig(self.server, self.ca.cert_path, pair.cert, pair.key)
            )

    # ---- properties -------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server's URL, ``https://127.0.0.1:PORT``."""
        return f"https://{LOOPBACK}:{self.ports['apiserver']}"

    @property
    def ca(self) -> CertificateAuthority:
        """The environment's CA (for webhook ``caBundle`` and serving certs)."""
        if self._ca is None:
            self._ca = CertificateAuthority(self.pki)
        return self._ca

    def _component_kubeconfig(self, name: str) -> Path:
        return self.state_dir / "kubeconfigs" / f"{name}.kubeconfig"

    def log(self, component: str) -> Path:
        """The log file of ``component`` (etcd, kube-apiserver, kube-scheduler, ...)."""
        return self.logs / f"{component}.log"

    # ---- components --------------------------------------------------------------------

    def _bin(self, name: str) -> str:
        assert self.binaries is not None
        return str(self.binaries[name])

    def _launch(
        self,
        name: str,
        argv_for: Callable[[], list[str]],
        health: Callable[[Process], None],
        ports: Iterable[str],
        env: dict[str, str] | None = None,
    ) -> None:
        """Start a component; if a port it was given got taken meanwhile, retry with new ones."""
        ports = list(ports)
        for attempt in range(_PORT_RETRIES):
            for p in ports:
                if attempt or p not in self.ports:
                    self.ports[p] = free_port()
            proc = Process.start(name, argv_for(), self.log(name), self.tied, env=env)
            self.processes[name] = proc
            self._pids[name] = proc.pid
            self._save_state()
            try:
                health(proc)
                return
            except StartError:
                proc.stop()
                if attempt + 1 < _PORT_RETRIES and _port_clash(proc.log):
                    continue
                raise

    def _start_etcd(self, timeout: float) -> None:
        data = self.state_dir / "etcd-data"

        def argv() -> list[str]:
            client = f"http://{LOOPBACK}:{self.ports['etcd']}"
            peer = f"http://{LOOPBACK}:{self.ports['etcd-peer']}"
            return [
                self._bin("etcd"),
                "--name=testenv",
                f"--data-dir={data}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=testenv={peer}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=4294967296",
            ]

        def health(proc: Process) -> None:
            wait_http(
                proc,
                f"http://{LOOPBACK}:{self.ports['etcd']}/health",
                timeout,
                ok=lambda s, body: s == 200 and b'"health":"true"' in body,
            )

        self._launch("etcd", argv, health, ["etcd", "etcd-peer"])

    def _start_apiserver(self, timeout: float, taint_new_nodes: bool) -> None:
        ca = self.ca
        # New nodes get a not-ready taint at admission, which the node lifecycle controller
        # (kube-controller-manager) lifts once kwok reports them Ready. Without that
        # controller nothing would lift it, so the taint is not put on either.
        admission = [] if taint_new_nodes else ["--disable-admission-plugins=TaintNodesByCondition"]

        kubelet_client = self._clients["apiserver-kubelet-client"]

        def argv() -> list[str]:
            self._write_kubeconfigs()  # they name the port, which changes on a retry
            return [
                self._bin("kube-apiserver"),
                f"--etcd-servers=http://{LOOPBACK}:{self.ports['etcd']}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={self.ports['apiserver']}",
                f"--advertise-address={LOOPBACK}",
                # The "kubernetes" Service cannot have a loopback endpoint; keep none.
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={self._serving.cert}",
                f"--tls-private-key-file={self._serving.key}",
                f"--client-ca-file={ca.cert_path}",
                # A real node (testenv.realnode) is reached by its name, "localhost":
                # kubelet refuses a loopback node IP and would report the machine's own
                # address as InternalIP, which tests must never dial.
                "--kubelet-preferred-address-types=Hostname",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                "--authorization-mode=Node,RBAC",
                "--anonymous-auth=false",
                f"--service-account-key-file={self._sa.cert}",
                f"--service-account-signing-key-file={self._sa.key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                # /debug/pprof for an investigation (TESSERA_TESTENV_PROFILING=1); off
                # otherwise, so no test depends on it.
                f"--profiling={'true' if os.environ.get('TESSERA_TESTENV_PROFILING') else 'false'}",
                *admission,
                "--v=1",
            ]

        def health(proc: Process) -> None:
            wait_http(proc, f"{self.server}/readyz", timeout, context=self.ssl_context())

        self._launch("kube-apiserver", argv, health, ["apiserver"])

    def _start_controller_manager(self, timeout: float) -> None:
        kubeconfig = self._component_kubeconfig("kube-controller-manager")

        def argv() -> list[str]:
            return [
                self._bin("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={self.ports['kube-controller-manager']}",
                f"--tls-cert-file={self._components_serving.cert}",
                f"--tls-private-key-file={self._components_serving.key}",
                "--leader-elect=false",
                # The default client limit (20 QPS) makes the node lifecycle controller lift
                # the not-ready taint from ~5 nodes/s: 4 min for the 1,213 openb nodes.
                "--kube-api-qps=1000",
                "--kube-api-burst=2000",
                f"--service-account-private-key-file={self._sa.key}",
                f"--root-ca-file={self.ca.cert_path}",
                # Each controller acts as its own service account, with the bootstrap RBAC
                # roles made for it (the manager's own identity may do little).
                "--use-service-account-credentials=true",
                f"--cluster-cidr={POD_CIDR}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No cloud, no real kubelets: these controllers have nothing to do here.
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,"
                "-node-route-controller,-persistentvolume-attach-detach-controller",
                "--v=1",
            ]

        def health(proc: Process) -> None:
            url = f"https://{LOOPBACK}:{self.ports['kube-controller-manager']}/healthz"
            wait_http(proc, url, timeout, context=self.ssl_context(client=False))

        self._launch("kube-controller-manager", argv, health, ["kube-controller-manager"])

    def _wait_default_service_account(self, timeout: float) -> None:
        """Pods need their namespace's ``default`` ServiceAccount, which the controller
        manager creates once its controllers run: the env is usable when it exists."""
        proc = self.processes["kube-controller-manager"]
        url = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        try:
            wait_http(proc, url, timeout, context=self.ssl_context())
        except StartError as exc:
            raise proc.fail(f"no 'default' ServiceAccount in namespace default: {exc}") from None

    def _write_scheduler_config(self, scheduler_config: SchedulerConfig) -> None:
        if isinstance(scheduler_config, str | Path):
            path = Path(scheduler_config)
            try:
                base = yaml.safe_load(path.read_text())
            except (OSError, yaml.YAMLError) as exc:
                raise StartError(
                    "kube-scheduler", f"cannot read scheduler config {path}: {exc}"
                ) from exc
            if not isinstance(base, dict):
                raise StartError("kube-scheduler", f"scheduler config {path} is not a YAML mapping")
        else:
            base = dict(scheduler_config or {})
        try:
            self._scheduler_config = cfg.scheduler_config(
                base, self._component_kubeconfig("kube-scheduler")
            )
        except ValueError as exc:
            raise StartError("kube-scheduler", str(exc)) from None
        cfg.write_yaml(self.state_dir / "scheduler-config.yaml", self._scheduler_config)

    def _start_scheduler(self, timeout: float) -> None:
        kubeconfig = self._component_kubeconfig("kube-scheduler")

        def argv() -> list[str]:
            return [
                self._bin("kube-scheduler"),
                f"--config={self.state_dir / 'scheduler-config.yaml'}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={LOOPBACK}",
                f"--secure-port={self.ports['kube-scheduler']}",
                f"--tls-cert-file={self._components_serving.cert}",
                f"--tls-private-key-file={self._components_serving.key}",
                "--v=1",
            ]

        def health(proc: Process) -> None:
            url = f"https://{LOOPBACK}:{self.ports['kube-scheduler']}/readyz"
            wait_http(proc, url, timeout, context=self.ssl_context(client=False))

        self._launch("kube-scheduler", argv, health, ["kube-scheduler"])

    def _start_kwok(self, timeout: float) -> None:
        options = testenv_dir() / "kwok" / "kwok.yaml"
        stages = testenv_dir() / "kwok" / "stages.yaml"
        home = self.state_dir / "kwok-home"  # keeps a user's ~/.kwok/kwok.yaml out
        home.mkdir(exist_ok=True)

        def argv() -> list[str]:
            return [
                self._bin("kwok"),
                f"--config={options}",
                f"--config={stages}",
                f"--kubeconfig={self._component_kubeconfig('kwok')}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_SELECTOR}",
                f"--server-address={LOOPBACK}:{self.ports['kwok']}",
                f"--cidr={POD_CIDR}",
                f"--node-ip={LOOPBACK}",
                "--node-lease-duration-seconds=40",
            ]

        def health(proc: Process) -> None:
            wait_http(proc, f"http://{LOOPBACK}:{self.ports['kwok']}/healthz", timeout)

        self._launch("kwok", argv, health, ["kwok"], env=dict(os.environ, HOME=str(home)))

    def restart_scheduler(
        self, scheduler_config: SchedulerConfig = None, timeout: float = 60.0
    ) -> None:
        """Stop kube-scheduler and start it again with ``scheduler_config`` (e.g. new extenders)."""
        if self.binaries is None:
            raise TestEnvError("restart_scheduler needs the environment that started it")
        proc = self.processes.pop("kube-scheduler", None)
        if proc is not None:
            proc.stop()
        self._write_scheduler_config(scheduler_config)
        self._start_scheduler(timeout)

    def restart_apiserver(self, timeout: float = 90.0) -> None:
        """Stop kube-apiserver and start it again on the same port (its clients reconnect;
        etcd keeps the state). For chaos runs: watches break, requests in flight fail.

        In a tied environment the new process dies with the *thread* that calls this
        (PR_SET_PDEATHSIG is per thread): call it from a thread that outlives the run."""
        if self.binaries is None:
            raise TestEnvError("restart_apiserver needs the environment that started it")
        proc = self.processes.pop("kube-apiserver", None)
        if proc is not None:
            proc.stop()
        self._start_apiserver(timeout, taint_new_nodes="kube-controller-manager" in self.processes)

    # ---- clients -------------------------------------------------------------------------

    def ssl_context(self, client: bool = True) -> ssl.SSLContext:
        """TLS context trusting the env's CA; with ``client``, presenting the admin cert."""
        ctx = ssl.create_default_context(cafile=str(self.ca.cert_path))
        if client:
            ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def api_client(self, pool_size: int = 32) -> ApiClient:
        """A ``kubernetes.client.ApiClient`` acting as cluster admin. Close it when done."""
        from kubernetes import client

        conf = client.Configuration()
        conf.host = self.server
        conf.ssl_ca_cert = str(self.ca.cert_path)
        conf.cert_file = str(self.pki / "admin.crt")
        conf.key_file = str(self.pki / "admin.key")
        conf.verify_ssl = True
        conf.connection_pool_maxsize = pool_size
        return client.ApiClient(conf)

    def issue_serving_cert(
        self, name: str, hosts: tuple[str, ...] = (LOOPBACK, "localhost")
    ) -> CertPair:
        """A serving certificate signed by the env's CA, e.g. for an admission webhook
        on 127.0.0.1 (its ``caBundle`` is ``env.ca.pem``)."""
        return self.ca.issue(name, name, hosts=hosts, client=False, server=True)

    # ---- nodes --------------------------------------------------------------------------

    def create_gpu_nodes(
        self,
        nodes: Iterable[NodeInventory],
        *,
        names: ResourceNames | None = None,
        workers: int = 16,
        wait_ready: bool = True,
        timeout: float | None = None,
    ) -> list[str]:
        """Create one kwok-managed Node per inventory, ``workers`` requests at a time.

        Returns the node names. With ``wait_ready``, returns once kwok reports all Ready
        and the node lifecycle controller has lifted the not-ready taint: schedulable.
        ``timeout`` defaults to 120 s, or 0.1 s a node beyond that: kwok on a 2-core
        machine readies about 18 nodes a second.
        """
        from kubernetes import client

        manifests = [node_manifest(n, names) for n in nodes]
        api: Any = self.api_client(pool_size=workers)  # the client is only partly typed
        try:
            core: Any = client.CoreV1Api(api)

            def create(body: dict[str, Any]) -> str:
                core.create_node(body)
                return str(body["metadata"]["name"])

            with ThreadPoolExecutor(max_workers=workers) as pool:
                created = list(pool.map(create, manifests))
            if wait_ready:
                limit = timeout if timeout is not None else max(120.0, 0.1 * len(created))
                self._wait_ready(core, set(created), limit)
        finally:
            api.close()
        return created

    def ready_nodes(self, core: Any, label_selector: str = "type=kwok") -> tuple[int, set[str]]:
        """(number of nodes matching, names of those Ready and without the not-ready
        taint, i.e. schedulable). Reads raw JSON: the typed client needs seconds to
        decode a thousand nodes."""
        resp = core.list_node(label_selector=label_selector, _preload_content=False)
        try:
            items = json.loads(resp.data)["items"]
        finally:
            resp.release_conn()
        ready = {n["metadata"]["name"] for n in items if _schedulable(n)}
        return len(items), ready

    def _wait_ready(self, core: Any, wanted: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # Listing thousands of nodes costs the API server and kwok what readies them.
        pause = 0.5 if len(wanted) <= 1000 else 2.0
        while True:
            missing = wanted - self.ready_nodes(core)[1]
            if not missing:
                return
            if time.monotonic() >= deadline:
                sample = ", ".join(sorted(missing)[:5])
                raise StartError(
                    "kwok",
                    f"{len(missing)} of {len(wanted)} nodes not Ready after {timeout:.0f} s "
                    f"(e.g. {sample})\n  log {self.log('kwok')}:\n{log_tail(self.log('kwok'))}",
                )
            time.sleep(pause)

    # ---- stopping -----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every component (reverse start order) and forget the pids; idempotent."""
        order = ["kwok", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]
        names = sorted(
            set(self._pids) | set(self.processes),
            key=lambda n: order.index(n) if n in order else -1,
        )
        for name in names:
            proc = self.processes.pop(name, None)
            if proc is not None:
                proc.stop()
            else:
                pid = self._pids.get(name)
                if pid and pid_alive(pid) and _is_ours(pid, self.state_dir):
                    kill_group(pid)
            self._pids.pop(name, None)
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / STATE_FILE).unlink()

    def running(self) -> dict[str, bool]:
        """Per component: whether its process is alive."""
        return {name: pid_alive(pid) for name, pid in self._pids.items()}

    def listening_ports(self) -> list[int]:
        """Those of the env's ports on which something still listens."""
        return [p for p in self.ports.values() if port_in_use(p)]

    def __enter__(self) -> TestEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- files --------------------------------------------------------------------------

    def _save_state(self) -> None:
        state = {
            "ports": self.ports,
            "pids": self._pids,
            "kubeconfig": str(self.kubeconfig),
            "server": self.server if "apiserver" in self.ports else None,
        }
        tmp = self.state_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.rename(self.state_dir / STATE_FILE)


def _schedulable(node: Mapping[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t.get("key") == NOT_READY_TAINT for t in taints)


def _running_pids(state_dir: Path) -> dict[str, int]:
    try:
        state = json.loads((state_dir / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return {
        n: int(p)
        for n, p in state.get("pids", {}).items()
        if pid_alive(int(p)) and _is_ours(int(p), state_dir)
    }


def _is_ours(pid: int, state_dir: Path) -> bool:
    """Whether ``pid`` is a component of the env in ``state_dir`` (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(state_dir).encode() in cmdline


def _port_clash(log: Path) -> bool:
    return "address already in use" in log_tail(log, 40)
