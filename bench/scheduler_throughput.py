"""Pods per second through the real kube-scheduler, with the Tessera extender and without.

    .venv/bin/python bench/scheduler_throughput.py                 # 1000 pods, 500 nodes
    .venv/bin/python bench/scheduler_throughput.py --pods 2000 --nodes 1000

One test control plane (testenv: etcd, kube-apiserver, kube-scheduler, kwok) with
``--nodes`` kwok nodes of 8 cards. Runs of ``--pods`` pods asking for one whole card
(``tessera.io/gpu: 1``):

* **stock**: kube-scheduler without extender; it places the pods by the extended
  resource ``tessera.io/gpu`` the nodes advertise (NodeResourcesFit) -- the anchor;
* **tessera**: kube-scheduler configured by deploy/kube-scheduler-config.yaml, calling
  the ``tessera scheduler`` process (its own process, as deployed) for filter and bind;
  the pods get card assignments.

All pods of a run are created first, while the scheduler runs a profile no pod names
(so creation speed does not count); then kube-scheduler restarts with the run's profile.
Two rates, times taken from a watch:

* **bound**: (pods - 1) / (last bind - first bind);
* **bound and Running**: (pods - 1) / (last pod Running - first bind), Running being
  what kwok (the kubelet here) reports. On a saturated control plane kwok falls behind
  the binds, the more so the faster they come, so at the last bind a faster scheduler
  has left more of each pod's work (kwok's status patch, its watch events) undone; this
  rate counts the same work for every run, as a steady stream of pods would.
  ``--kwok-pods off`` takes kwok's per-pod work away instead (bound pods stay Pending):
  then the bound rate itself compares the same work.
After each run its pods are deleted, so every run starts from the same cluster (1,000
running pods cost kwok and the API server ~0.2 of a core, which would tax the later
run). ``--rounds`` rounds of one run of each kind, in rotating order; the machine is noisy,
so the table gives the medians, every round's rates, the CPU each process spent
per pod (from /proc), and the requests kube-apiserver served per pod by verb and
resource (its own apiserver_request_total, from /metrics) -- which shows what an
extender adds to the API's work. Nothing is asserted.

``--layout``: with ``shared`` (the default) every process may use every CPU, so the
extender's CPU is taken from the API server and kube-scheduler -- on a 2-core machine
that, not the extender's latency, sets the rate. ``split`` keeps the control plane
(etcd, API server, controller manager, kube-scheduler, kwok, this process) on the first
half of the CPUs in every run and the extender on the other half, as when it runs in its
own pod on another node.

``--claims`` adds a run of the claims path: the same stock kube-scheduler with no
extender, every node's 8 cards published as a ResourceSlice (tessera.claims.devices, as
the node agent writes it), the chart's DeviceClasses, and pods whose ResourceClaimTemplate
asks for the sharing shape (8000Mi / 10 %): kube-scheduler's DRA allocator places them.
``--claims-quota`` adds the same claims with Tessera's claims webhook in the path (the
chart's claims.tessera.io, served by a ``tessera scheduler`` on the extender's CPUs) and a
GpuQuota in the namespace that admits every pod, so each allocation is judged and counted:
what GpuQuota on claims costs the claims path, against the plain claims run.

``--shape sharing`` gives the extenders pods of 8,000 MiB / 10 % of a card, and adds
**stock-sharing**: stock kube-scheduler counting those pods against the nodes' totals
(it chooses no card). Its own filters then pay what the pods' two extended resources
cost them (NodeResourcesFit checks every resource on every node), as they do under an
extender; stock on whole cards stays the anchor of the ratios, as in issue 15.

A fourth table is kube-scheduler's cycle, from its own histograms: the scheduling
algorithm's mean (the serial part of the cycle), its filter and score plugins, and the
extender's filter call (the rest), beside the time between binds and how many CPUs the
control plane kept busy (its CPU per pod times the rate) -- 1.00 of one CPU on the split
layout means the run is bound by the control plane's CPU, not by the cycle's latency.
``--nodes-to-score PCT...`` sets kube-scheduler's percentageOfNodesToScore (default 100,
the chart's: every node is filtered, scored and sent to the extender; 0 is
kube-scheduler's adaptive default). With several, every kind runs under each in every
round, the runs under the second and later named ``KIND@PCT``; ratios are to stock under
the first and to stock under the same setting.
``--profile DIR`` also writes 4 s CPU profiles of kube-scheduler and kube-apiserver per
run.

``--extender null`` runs bench/null_extender.py instead of ``tessera scheduler``: the same
protocol, HTTP stack and watches, no decisions -- the most any Python extender could get.
``--extender both`` runs stock, Tessera and null in every round, so all three compare in
one run.
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import http.client
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import urllib3
import yaml
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from tessera.claims.devices import resource_slice  # noqa: E402
from tessera.kube import (  # noqa: E402
    GPUQUOTAS,
    NODES,
    PODS,
    Conflict,
    Kind,
    Obj,
    Reflector,
    WatchEvent,
)
from tessera.kube.client import KubeClient  # noqa: E402
from tessera.kube.errors import NotFound, Unavailable  # noqa: E402
from tessera.kube.kinds import (  # noqa: E402
    DEVICE_CLASSES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from tessera.model.clusterspec import synthetic_nodes  # noqa: E402
from tessera.testenv import TestEnv, ensure_binaries  # noqa: E402
from tessera.testenv.chart import deployed, install_gpuquota_crd, kube_scheduler_config  # noqa: E402
from tessera.testenv.process import free_port  # noqa: E402

PARKED = {"profiles": [{"schedulerName": "parked"}]}


class BindTimes:
    """When each pod of the namespace got its node, and when kwok (the kubelet here)
    reported it Running (watch event arrival times)."""

    def __init__(self, api: KubeClient, namespace: str) -> None:
        self.times: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()
        self.r = Reflector(api, PODS, self, namespace=namespace, watch_timeout_s=120)
        self.r.start()
        assert self.r.synced.wait(30)

    def replace(self, items: list[Obj]) -> None:
        for o in items:
            self._see(o)

    def apply(self, event: WatchEvent) -> None:
        if event.type != "DELETED":
            self._see(event.object)

    def _see(self, o: Obj) -> None:
        if (o.get("spec") or {}).get("nodeName"):
            now = time.monotonic()
            with self.lock:
                self.times.setdefault(o["metadata"]["name"], now)
                if (o.get("status") or {}).get("phase") == "Running":
                    self.running.setdefault(o["metadata"]["name"], now)


WHOLE = {"tessera.io/gpu": "1"}
# What the issue measured for sharing: 8,000 MiB and 10 % of one card (5 pods fit a card).
SHARING = {"tessera.io/gpu-memory": "8000", "tessera.io/gpu-cores": "10"}


# The claims path's twin of SHARING, as a ResourceClaimTemplate.
CLAIM_TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "sharing"},
    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.tessera.io",
        "capacity": {"requests": {"memory": "8000Mi", "compute": "10"}}}}]}}},
}  # fmt: skip


def pod(
    name: str, scheduler: str, limits: dict[str, str] = WHOLE, claims: bool = False
) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": dict(limits)}
    spec: dict[str, Any] = {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0}
    if claims:
        resources = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "sharing"}]
    spec["containers"] = [{"name": "main", "image": "busybox", "resources": resources}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def publish_slices(env: TestEnv, api: KubeClient, nodes: int) -> None:
    """Every node's cards as a ResourceSlice, and the chart's DeviceClasses."""
    for doc in deployed("device-classes.yaml"):
        api.create(DEVICE_CLASSES, doc)
    cards = {n.name: n.cards for n in synthetic_nodes(nodes, 8, "A100", prefix="gpu")}
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in api.list(NODES).items}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: api.create(RESOURCE_SLICES, resource_slice(
            n, cards[n], 1, node_uid=uids[n])), cards))  # fmt: skip


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU each process has used so far (/proc/PID/stat fields 14 and 15)."""
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


_REQUEST_TOTAL = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_requests(api: KubeClient) -> collections.Counter[str]:
    """The requests kube-apiserver has served so far, by verb and resource ("POST
    pods/binding"), all response codes together -- its own apiserver_request_total."""
    pool = urllib3.PoolManager(ssl_context=api.ssl_context(),
                               server_hostname=api.server_hostname())  # fmt: skip
    resp = pool.request("GET", api.host + "/metrics", headers=api.headers(), timeout=30)
    if resp.status != 200:
        raise SystemExit(f"kube-apiserver /metrics: HTTP {resp.status}")
    out: collections.Counter[str] = collections.Counter()
    for line in resp.data.decode().splitlines():
        m = _REQUEST_TOTAL.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(1)))
            sub = labels.get("subresource", "")
            resource = labels.get("resource", "") + (f"/{sub}" if sub else "")
            out[f"{labels.get('verb', '?')} {resource}"] += round(float(m.group(2)))
    return out


_HISTOGRAM = re.compile(r"^(scheduler_\w+_seconds)_(sum|count)(?:\{(.*)\})? (\S+)$")


def scheduler_histograms(env: TestEnv) -> dict[str, tuple[float, float]]:
    """kube-scheduler's duration histograms as {"name{labels}": (count, sum)}, from its own
    /metrics; it restarts at each run's start, so they cover that run."""
    url = f"https://127.0.0.1:{env.ports['kube-scheduler']}/metrics"
    resp = urllib3.PoolManager(ssl_context=env.ssl_context()).request("GET", url, timeout=30)
    if resp.status != 200:
        raise SystemExit(f"kube-scheduler /metrics: HTTP {resp.status}")
    out: dict[str, tuple[float, float]] = {}
    for line in resp.data.decode().splitlines():
        m = _HISTOGRAM.match(line)
        if m:
            key = f"{m.group(1)}{{{m.group(3) or ''}}}"
            count, total = out.get(key, (0.0, 0.0))
            value = float(m.group(4))
            out[key] = (value, total) if m.group(2) == "count" else (count, value)
    return out


def cycle_ms(histograms: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean ms per pod of kube-scheduler's scheduling algorithm (the serial part of its
    cycle: its own filters, the extenders, scoring) and of its parts. The extender's
    filter call has no histogram of its own: it is the algorithm less the framework's
    extension points that run inside it."""

    def mean(key: str) -> float:
        count, total = histograms.get(key, (0.0, 0.0))
        return 1000 * total / count if count else 0.0

    def point(name: str) -> float:
        keys = [k for k in histograms if k.startswith(
            "scheduler_framework_extension_point_duration_seconds{")
            and f'extension_point="{name}"' in k]  # fmt: skip
        count = sum(histograms[k][0] for k in keys)
        return 1000 * sum(histograms[k][1] for k in keys) / count if count else 0.0

    algorithm = mean("scheduler_scheduling_algorithm_duration_seconds{}")
    parts = {name: point(name) for name in ("PreFilter", "Filter", "PreScore", "Score")}
    return {
        "algorithm": algorithm,
        "filter plugins": parts["Filter"],
        "score plugins": parts["Score"],
        "extender filter call": max(0.0, algorithm - sum(parts.values())),
    }


def profile_control_plane(env: TestEnv, bound: Callable[[], int], prefix: str) -> threading.Thread:
    """Once 100 pods are bound, write 4 s CPU profiles of kube-scheduler and kube-apiserver
    (taken at once) to ``<prefix>-<process>.pprof``; read them with
    ``go tool pprof -top -cum``. kube-apiserver serves them only with
    TESSERA_TESTENV_PROFILING set, which --profile sets."""
    ports = {"kube-scheduler": env.ports["kube-scheduler"],
             "kube-apiserver": env.ports["apiserver"]}  # fmt: skip

    def grab(process: str) -> None:
        url = f"https://127.0.0.1:{ports[process]}/debug/pprof/profile?seconds=4"
        pool = urllib3.PoolManager(ssl_context=env.ssl_context())
        resp = pool.request("GET", url, timeout=30)
        path = Path(f"{prefix}-{process}.pprof")
        if resp.status == 200:
            path.write_bytes(resp.data)
        print(f"  {process} profile: HTTP {resp.status}, {path}", flush=True)

    def both() -> None:
        while bound() < 100:
            time.sleep(0.01)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(grab, ports))

    thread = threading.Thread(target=both, daemon=True)
    thread.start()
    return thread


class RunResult(NamedTuple):
    rate: float  # pods bound per second: (pods - 1) / (last bind - first bind)
    # (pods - 1) / (last pod Running - first bind): the same work in every run, since
    # kwok (the kubelet here) falls further behind the faster the binds come
    running_rate: float | None  # None with --kwok-pods off
    cpu: dict[str, float]  # CPU seconds per pod by process, until the last bind
    requests: dict[str, float]  # API requests per pod by verb and resource
    cycle: dict[str, float]  # kube-scheduler's scheduling algorithm, mean ms per pod


def run(
    env: TestEnv,
    api: KubeClient,
    ns: str,
    pods: int,
    config: dict[str, Any],
    extra: dict[str, int],
    kwok_pods: bool = True,
    limits: dict[str, str] = WHOLE,
    claims: bool = False,
    profile: Path | None = None,
    setup: Callable[[str], None] | None = None,
) -> RunResult:
    """One run (see RunResult). The run's pods are deleted at the end, so every run
    starts from the same cluster. ``setup(ns)``: called once the namespace exists."""
    api.create(Kind("v1", "Namespace", "namespaces", False), {"metadata": {"name": ns}})
    sa = Kind("v1", "ServiceAccount", "serviceaccounts", True)
    with contextlib.suppress(Conflict):
        api.create(sa, {"metadata": {"name": "default"}}, ns)
    if setup is not None:
        setup(ns)
    env.restart_scheduler(PARKED)
    scheduler = config["profiles"][0]["schedulerName"]
    if claims:
        api.create(RESOURCE_CLAIM_TEMPLATES, CLAIM_TEMPLATE, ns)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: api.create(PODS, pod(f"p-{i:05d}", scheduler, limits, claims),
                                           ns), range(pods)))  # fmt: skip
    if claims:  # the resourceclaim controller makes each pod's claim, outside the window
        deadline = time.monotonic() + 300
        while len(api.list(RESOURCE_CLAIMS, ns).items) < pods:
            if time.monotonic() > deadline:
                raise SystemExit(f"{ns}: the claims of the pods were not made in 300 s")
            time.sleep(0.5)
    watch = BindTimes(api, ns)
    # Requests are counted from before the start (reading /metrics takes a loaded API
    # server a second or more) until every pod is Running (bound, with --kwok-pods off):
    # every pod's requests, and kube-scheduler's start-up lists.
    requests_before = api_requests(api)
    env.restart_scheduler(config)
    pids = {name: proc.pid for name, proc in env.processes.items()}
    pids.update(extra, bench=os.getpid())
    # kube-scheduler may bind some pods while restart_scheduler waits for it to be
    # ready: the CPU is divided by the binds seen in its window.
    started = time.monotonic()
    if profile is not None:
        profiling = profile_control_plane(env, lambda: len(watch.times), str(profile / ns))
    before = cpu_seconds(pids)
    deadline = time.monotonic() + 600
    while len(watch.times) < pods and time.monotonic() < deadline:
        time.sleep(0.05)
    after = cpu_seconds(pids)
    after_at = time.monotonic()
    times = sorted(watch.times.values())
    if len(times) < pods:
        raise SystemExit(f"{ns}: only {len(times)} of {pods} pods bound in 600 s")
    in_window = max(1, sum(1 for t in times if t >= started))
    note = f"  {ns}: {pods - in_window} of {pods} pods bound before the CPU window"
    running_rate = None
    if kwok_pods:
        while len(watch.running) < pods and time.monotonic() < deadline:
            time.sleep(0.05)
        tail = cpu_seconds(pids)
        tail_s = time.monotonic() - after_at
        if len(watch.running) < pods:
            raise SystemExit(f"{ns}: only {len(watch.running)} of {pods} pods Running in 600 s")
        # Between the last bind and the last Running: kwok's backlog, or its own pace?
        # The control plane busy all that time means backlog (work the bind rate left out).
        tail_busy = sum(tail[n] - after[n] for n in tail if n in after and n != "extender")
        last_running = max(watch.running.values())
        running_rate = (pods - 1) / (last_running - times[0])
        busy = tail_busy / max(tail_s, 1e-9)
        note += (f"; the last Running {last_running - times[-1]:.2f} s after the last bind, "
                 f"the control plane using {busy:.2f} CPUs meanwhile")  # fmt: skip
    watch.r.stop()
    cycle = cycle_ms(scheduler_histograms(env))
    if profile is not None:
        profiling.join(30)
    requests = api_requests(api) - requests_before
    clear(api, ns)
    print(note, flush=True)
    return RunResult(
        rate=(len(times) - 1) / (times[-1] - times[0]),
        running_rate=running_rate,
        cpu={n: (after[n] - before[n]) / in_window for n in after if n in before},
        requests={key: n / pods for key, n in requests.items()},
        cycle=cycle,
    )


def clear(api: KubeClient, ns: str) -> None:
    """Delete the namespace's pods at once and wait until they are gone: running pods
    cost kwok and the API server CPU, which would slow whichever run came later."""
    # deletecollection with grace 0: the pods go at once (no kubelet here to confirm).
    # A busy API server may take longer than the client's timeout, and it stops deleting
    # when the client goes: ask again until none is left.
    deadline = time.monotonic() + 300
    while api.list(PODS, ns).items:
        if time.monotonic() > deadline:
            raise SystemExit(f"{ns}: pods still there 300 s after deleting them")
        with contextlib.suppress(Unavailable):
            api._request("DELETE", PODS.path(ns), {"gracePeriodSeconds": "0"})
        time.sleep(0.5)

    # The claims: the resourceclaim controller would release and delete them at its
    # client's 20 requests/s (minutes for 1,000, taxing the next run), so the bench
    # lifts their finalizer and deletes them itself; a deleted claim holds no device.
    def release(claim: Obj) -> None:
        with contextlib.suppress(NotFound):  # the controller may have got there first
            api.merge_patch(RESOURCE_CLAIMS, claim["metadata"]["name"],
                            {"metadata": {"finalizers": None}}, ns)  # fmt: skip

    deadline = time.monotonic() + 300
    while claims := api.list(RESOURCE_CLAIMS, ns).items:
        if time.monotonic() > deadline:
            raise SystemExit(f"{ns}: claims still there 300 s after deleting them")
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(release, claims))
        with contextlib.suppress(Unavailable):
            api._request("DELETE", RESOURCE_CLAIMS.path(ns))
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument(
        "--rounds", type=int, default=3,
        help="rounds of one run of each kind, the order rotating from round to round",
    )  # fmt: skip
    ap.add_argument(
        "--extender", choices=["tessera", "null", "both"], default="tessera",
        help="which extender runs beside stock; null: bench/null_extender.py, which decides "
        "nothing -- the floor of an extender hop; both: tessera and null in every round",
    )  # fmt: skip
    ap.add_argument(
        "--shape", choices=["whole", "sharing", "both"], default="whole",
        help="the extender's pods: one whole card each (as stock's), a sharing slice "
        "(8,000 MiB / 10 %%: tessera-sharing), or both kinds of run; stock always places "
        "whole cards (it cannot share one)",
    )  # fmt: skip
    ap.add_argument(
        "--claims", action="store_true",
        help="also run the claims path: stock kube-scheduler's DRA allocator, sharing-shaped "
        "claims (8000Mi / 10 %%) on ResourceSlices of every card",
    )  # fmt: skip
    ap.add_argument(
        "--claims-quota", action="store_true",
        help="also run the claims path with Tessera's claims webhook (the chart's "
        "claims.tessera.io) counting every allocation against a GpuQuota that admits all",
    )  # fmt: skip
    ap.add_argument(
        "--layout", choices=["shared", "split"], default="shared",
        help="shared: every process on every CPU; split: the extender on half the CPUs, "
        "everything else on the other half (see the module docstring)",
    )  # fmt: skip
    ap.add_argument(
        "--qps", type=float, default=500,
        help="kube-scheduler clientConnection.qps in every run (0: its default, 50)",
    )  # fmt: skip
    ap.add_argument(
        "--kwok-pods", choices=["run", "off"], default="run",
        help="off: kwok leaves bound pods Pending (its pod-running stage removed), so no run "
        "does per-pod kubelet work and the bound rate compares the same work",
    )  # fmt: skip
    ap.add_argument(
        "--profile", type=Path, metavar="DIR",
        help="write 4 s CPU profiles of kube-scheduler and kube-apiserver per run to "
        "DIR/<run>-<process>.pprof",
    )  # fmt: skip
    ap.add_argument(
        "--nodes-to-score", type=int, nargs="+", default=[100], metavar="PCT",
        help="kube-scheduler's percentageOfNodesToScore (0: adaptive); several: each kind "
        "runs under each, in every round",
    )  # fmt: skip
    args = ap.parse_args()
    for pct in args.nodes_to_score:
        if not 0 <= pct <= 100:
            ap.error(f"--nodes-to-score: must be 0 (adaptive) to 100 (got {pct})")
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ["TESSERA_TESTENV_PROFILING"] = "1"  # kube-apiserver's /debug/pprof
    extenders = ["tessera", "null"] if args.extender == "both" else [args.extender]
    # stock-sharing: stock kube-scheduler counting the sharing pods against the nodes'
    # totals (it chooses no card), so its own filters pay what the pods' two resources
    # cost them; stock (whole cards) stays the anchor of the ratios
    sharing = ["stock-sharing", *(f"{k}-sharing" for k in extenders)]
    kinds = {"whole": ["stock", *extenders], "sharing": ["stock", *sharing],
             "both": ["stock", *extenders, *sharing]}[args.shape]  # fmt: skip
    if args.claims or args.claims_quota:
        kinds.append("claims")
    if args.claims_quota:
        kinds.append("claims-quota")
    first = args.nodes_to_score[0]
    kinds = [k if pct == first else f"{k}@{pct}" for pct in args.nodes_to_score for k in kinds]
    extender_cpus = split_cpus() if args.layout == "split" else None
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-"))
    kwok_pods = args.kwok_pods == "run"
    if not kwok_pods:
        os.environ["TESSERA_TESTENV_DIR"] = str(testenv_without_pods_running(work))
    port = free_port()
    env = TestEnv.start(work / "env", binaries=ensure_binaries(["etcd", "kubernetes", "kwok"]),
                        scheduler_config=PARKED)  # fmt: skip
    ext: subprocess.Popen[bytes] | None = None
    results: dict[str, list[RunResult]] = {k: [] for k in kinds}
    try:
        env.create_gpu_nodes(synthetic_nodes(args.nodes, 8, "A100", prefix="gpu"))
        api = KubeClient.from_kubeconfig(str(env.kubeconfig))
        if args.claims or args.claims_quota:
            publish_slices(env, api, args.nodes)
        quota_hook = ClaimsQuotaHook(env, api, work) if args.claims_quota else None
        client = {"qps": args.qps, "burst": int(args.qps * 2)} if args.qps else {}
        stock: dict[str, Any] = {
            "profiles": [{"schedulerName": "stock"}],
            "clientConnection": dict(client),
        }
        extended = kube_scheduler_config()  # deploy/'s, as a cluster gets it
        extended.pop("leaderElection", None)
        extended["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
        extended["clientConnection"] = dict(client)
        verbs: dict[str, tuple[int, float]] = {}
        for r in range(args.rounds):
            order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
            for name in order:
                kind, pct = split_run(name, first)
                run_id = f"{name.replace('@', '-at')}-{r}"  # names pods: no "@"
                limits = SHARING if kind.endswith("-sharing") else WHOLE
                if kind == "claims-quota" and quota_hook is not None:
                    ext = quota_hook.start(extender_cpus)
                    config = {**stock, "percentageOfNodesToScore": pct}
                    result = run(env, api, run_id, args.pods, config, {"extender": ext.pid},
                                 kwok_pods, limits, claims=True, profile=args.profile,
                                 setup=quota_hook.quota)  # fmt: skip
                    verbs = _add_verbs(verbs, quota_hook.stop(args.pods))
                    ext = None
                elif kind in ("stock", "stock-sharing", "claims"):
                    config = {**stock, "percentageOfNodesToScore": pct}
                    result = run(env, api, run_id, args.pods, config, {}, kwok_pods,
                                 limits, claims=kind == "claims",
                                 profile=args.profile)  # fmt: skip
                else:
                    # Its own process per run, started before the run's window and
                    # stopped after: it watches every pod, so it must not tax other runs.
                    log_path = work / f"{run_id}.log"
                    null = kind.startswith("null")
                    ext = start_extender(env, port, log_path, extender_cpus, null=null)
                    config = {**extended, "percentageOfNodesToScore": pct}
                    result = run(env, api, run_id, args.pods, config,
                                 {"extender": ext.pid}, kwok_pods, limits,
                                 profile=args.profile)  # fmt: skip
                    if kind.startswith("tessera"):
                        verbs = _add_verbs(verbs, _read_verbs(port))
                    ext.terminate()
                    ext.wait(15)
                    ext = None
                results[name].append(result)
                running = (
                    "" if result.running_rate is None else f", {result.running_rate:.1f} running"
                )
                print(f"round {r + 1}/{args.rounds}: {name} {result.rate:.1f} pods/s "
                      f"bound{running}", flush=True)  # fmt: skip
    finally:
        if ext is not None:
            ext.terminate()
            ext.wait(15)
        env.stop()
    report(args, results, verbs)


def split_run(name: str, first: int) -> tuple[str, int]:
    """``KIND@PCT`` (or ``KIND``, under the first percentage) -> (KIND, PCT)."""
    kind, _, pct = name.partition("@")
    return kind, int(pct) if pct else first


def label(name: str) -> str:
    kind, _, pct = name.partition("@")
    return LABELS[kind] + (f", percentageOfNodesToScore {pct}" if pct else "")


def testenv_without_pods_running(work: Path) -> Path:
    """A copy of testenv/ whose kwok leaves bound pods Pending: with no per-pod kubelet
    work, every run's window holds the same work (the Binding and its event)."""
    copy = work / "testenv"
    shutil.copytree(REPO / "testenv", copy)
    path = copy / "kwok" / "stages.yaml"
    stages = [s for s in yaml.safe_load_all(path.read_text()) if s]
    kept = [s for s in stages if s["metadata"]["name"] != "tessera-pod-running"]
    if len(kept) != len(stages) - 1:
        raise SystemExit(f"{path}: no kwok stage named tessera-pod-running to remove")
    path.write_text(yaml.safe_dump_all(kept, sort_keys=False))
    return copy


def split_cpus() -> set[int]:
    """Keep this process -- and so every control-plane process it starts -- on the first
    half of the CPUs; return the second half, for the extender."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--layout split needs at least 2 CPUs")
    half = len(cpus) // 2
    os.sched_setaffinity(0, cpus[:half])  # children inherit it
    return set(cpus[half:])


class ClaimsQuotaHook:
    """Tessera's claims webhook as the chart installs it (deploy/webhook.yaml's
    claims.tessera.io, pointed at a process on 127.0.0.1), a GpuQuota CRD, and per run a
    quota of the run's namespace that admits every pod: each allocation goes through the
    webhook and is counted, the worst case of what the chart adds to the claims path."""

    CONFIG = Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration",
                  "validatingwebhookconfigurations", False)  # fmt: skip

    def __init__(self, env: TestEnv, api: KubeClient, work: Path) -> None:
        self.env, self.api, self.work = env, api, work
        self.serving = env.issue_serving_cert("tessera-webhook")
        install_gpuquota_crd(api)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = free_port()
        self.webhook_port = free_port()

    def start(self, cpus: set[int] | None) -> subprocess.Popen[bytes]:
        tls = [f"--webhook-port={self.webhook_port}", f"--tls-cert={self.serving.cert}",
               f"--tls-key={self.serving.key}"]  # fmt: skip
        self.proc = start_extender(self.env, self.port, self.work / "claims-quota.log", cpus,
                                   webhook=tls)  # fmt: skip
        [doc] = [d for d in deployed("webhook.yaml")
                 if d["kind"] == "ValidatingWebhookConfiguration"]  # fmt: skip
        [hook] = [h for h in doc["webhooks"] if h["name"] == "claims.tessera.io"]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{self.webhook_port}/validate-claims",
            "caBundle": base64.b64encode(self.env.ca.pem).decode(),
        }
        self.api.create(self.CONFIG, {"apiVersion": doc["apiVersion"], "kind": doc["kind"],
                                      "metadata": {"name": "bench-claims-quota"},
                                      "webhooks": [hook]})  # fmt: skip
        time.sleep(2)  # the API server's webhook informer picks it up
        return self.proc

    def quota(self, ns: str) -> None:
        limit = {"name": "all", "models": ["*"], "memoryMiB": 10**9}
        self.api.create(GPUQUOTAS, {"apiVersion": "tessera.io/v1alpha1", "kind": "GpuQuota",
                                    "metadata": {"name": "gpus"},
                                    "spec": {"limits": [limit]}}, ns)  # fmt: skip

    def stop(self, pods: int) -> dict[str, tuple[int, float]]:
        """Remove the webhook and stop the process; its verbs' counts and mean times (a
        run whose allocations did not all go through the webhook measured nothing)."""
        verbs = _read_verbs(self.port)
        calls = verbs.get("validate-claims", (0, 0.0))[0]
        if calls < pods:
            raise SystemExit(f"the claims webhook judged {calls} allocations of {pods}")
        with contextlib.suppress(NotFound):
            self.api.delete(self.CONFIG, "bench-claims-quota")
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(15)
            self.proc = None
        return verbs


def start_extender(
    env: TestEnv,
    port: int,
    log_path: Path,
    cpus: set[int] | None = None,
    null: bool = False,
    webhook: list[str] | None = None,
) -> subprocess.Popen[bytes]:
    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)  # in the child, before exec: all its threads

    if null:
        argv = [sys.executable, str(REPO / "bench" / "null_extender.py"), str(env.kubeconfig),
                str(port)]  # fmt: skip
    else:
        argv = [sys.executable, "-m", "tessera.cli", "scheduler", f"--kubeconfig={env.kubeconfig}",
                "--host=127.0.0.1", f"--port={port}", "--no-leader-elect",
                "--log-level=WARNING", *(webhook or ["--webhook-port=0"])]  # fmt: skip
    ext = subprocess.Popen(
        argv,
        stdout=log_path.open("wb"), stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")), preexec_fn=pin,
    )  # fmt: skip
    _wait_ready(port)
    return ext


def _read_verbs(port: int) -> dict[str, tuple[int, float]]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/metrics")
    return _verb_means(c.getresponse().read().decode())


def _add_verbs(
    a: dict[str, tuple[int, float]], b: dict[str, tuple[int, float]]
) -> dict[str, tuple[int, float]]:
    """Call counts and mean times of two runs together."""
    out = dict(a)
    for verb, (n, mean) in b.items():
        n0, mean0 = out.get(verb, (0, 0.0))
        out[verb] = (n0 + n, (n0 * mean0 + n * mean) / max(n0 + n, 1))
    return out


def _wait_ready(port: int) -> None:
    for _ in range(300):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the extender did not become ready in 60 s")


LABELS = {
    "stock": "stock kube-scheduler (extended resource)",
    "tessera": "with the Tessera extender (filter + bind)",
    "null": "with the null extender (bench/null_extender.py)",
    "stock-sharing": "stock kube-scheduler, sharing pods counted against node totals",
    "tessera-sharing": "Tessera extender, sharing pods (8,000 MiB / 10 %)",
    "null-sharing": "null extender, sharing pods",
    "claims": "stock kube-scheduler, DRA claims (8000Mi / 10 %)",
    "claims-quota": "the same claims, each allocation through Tessera's claims webhook "
    "and counted against a GpuQuota",
}


def report(
    args: argparse.Namespace,
    results: dict[str, list[RunResult]],
    verbs: dict[str, tuple[int, float]],
) -> None:
    qps = f"qps {args.qps:g}" if args.qps else "default qps"
    shape = {"whole": "whole-card", "sharing": "sharing", "both": "whole-card and sharing"}
    table = Table(title=f"kube-scheduler throughput, {args.pods} {shape[args.shape]} pods on "
                  f"{args.nodes} kwok nodes, percentageOfNodesToScore "
                  f"{' / '.join(map(str, args.nodes_to_score))}, "
                  f"{qps}, {args.rounds} rounds, {args.layout} CPUs "
                  f"({os.cpu_count()} CPUs, {platform.machine()})")  # fmt: skip
    table.add_column("run")
    table.add_column("pods/s, median", justify="right")
    table.add_column("each round", justify="right")
    measures = [("rate", "bound"), ("running_rate", "bound and Running")]
    if any(r.running_rate is None for runs in results.values() for r in runs):
        measures = measures[:1]
    for measure, what in measures:
        rates = {k: [getattr(r, measure) for r in runs] for k, runs in results.items()}
        for kind, values in rates.items():
            row = ", ".join(f"{x:.0f}" for x in values)
            table.add_row(f"{label(kind)}: {what}", f"{statistics.median(values):.1f}", row)
        ratios = [(k, "stock") for k in rates if k != "stock"]
        for k in rates:
            base, at, pct = k.partition("@")
            if base.endswith("-sharing") and base != "stock-sharing":
                ratios.append((k, f"stock-sharing{at}{pct}"))
            if at and base != "stock":
                ratios.append((k, f"stock@{pct}"))
            if base == "claims-quota":
                ratios.append((k, f"claims{at}{pct}"))
        ratios = [(k, anchor) for k, anchor in ratios if anchor in rates]
        for kind, anchor in ratios:
            pairs = zip(rates[anchor], rates[kind], strict=True)
            per_round = ", ".join(f"{t / s:.0%}" for s, t in pairs)
            ratio = statistics.median(rates[kind]) / statistics.median(rates[anchor])
            table.add_row(f"ratio, {kind} / {anchor}, {what}", f"{ratio:.0%}", per_round)
    for verb, (count, mean) in sorted(verbs.items()):
        table.add_row(f"  extender {verb}: {count} calls, mean in handler", f"{mean * 1000:.2f} ms")
    console = Console(width=160)  # the tables are wider than a pipe's default 80
    console.print(table)
    cpu_table = Table(title="CPU per pod, ms, median of the rounds (from kube-scheduler "
                      "ready until the last bind, per pod bound in that time)")  # fmt: skip
    cpu_table.add_column("process")
    for kind in results:
        cpu_table.add_column(kind, justify="right")
    cpus = {k: [r.cpu for r in runs] for k, runs in results.items()}

    def median_of(kind: str, process: str) -> float:
        values = [c[process] for c in cpus[kind] if process in c]
        return statistics.median(values) if values else 0.0

    last = list(results)[-1]
    processes = {p for runs in cpus.values() for c in runs for p in c}
    for process in sorted(processes, key=lambda p: -median_of(last, p)):
        cpu_table.add_row(process, *(f"{median_of(k, process) * 1000:.2f}" for k in results))
    totals = [statistics.median(sum(c.values()) for c in cpus[k]) for k in results]
    cpu_table.add_row("total", *(f"{t * 1000:.2f}" for t in totals))
    console.print(cpu_table)
    console.print(cycle_table(results, cpus))
    console.print(requests_table({k: [r.requests for r in runs] for k, runs in results.items()}))


def cycle_table(results: dict[str, list[RunResult]], cpus: dict[str, list[dict[str, float]]]
                ) -> Table:  # fmt: skip
    """kube-scheduler's serial cycle against the time between binds, and how busy the
    control plane's CPUs were (its CPU per pod times the rate): the two ways a run is
    bound -- by the cycle's latency, or by the control plane's CPU."""
    table = Table(title="kube-scheduler's cycle, mean ms per pod (its own histograms), and "
                  "the control plane's CPUs in use; medians of the rounds")  # fmt: skip
    table.add_column("")
    for kind in results:
        table.add_column(kind, justify="right")
    parts = list(next(iter(results.values()))[0].cycle)
    for part in parts:
        table.add_row(part, *(f"{statistics.median(r.cycle[part] for r in results[k]):.2f}"
                              for k in results))  # fmt: skip
    table.add_row("time between binds (1 / bound rate)",
                  *(f"{statistics.median(1000 / r.rate for r in results[k]):.2f}"
                    for k in results))  # fmt: skip

    def busy(kind: str) -> float:
        plane = [sum(v for p, v in c.items() if p != "extender") for c in cpus[kind]]
        return statistics.median(cp * r.rate for cp, r in zip(plane, results[kind], strict=True))

    table.add_row("control plane CPUs in use (CPU per pod × rate)",
                  *(f"{busy(k):.2f}" for k in results))  # fmt: skip
    return table


def requests_table(requests: dict[str, list[dict[str, float]]]) -> Table:
    """API requests per pod by verb and resource, medians of the rounds; rows under 0.01
    per pod in every run are left out (a re-list or two in the window)."""
    title = ("kube-apiserver requests per pod (apiserver_request_total), median of the "
             "rounds, from before kube-scheduler starts until the run's end")  # fmt: skip
    table = Table(title=title)
    table.add_column("request")
    for kind in requests:
        table.add_column(kind, justify="right")

    def median_of(kind: str, key: str) -> float:
        return statistics.median(r.get(key, 0.0) for r in requests[kind])

    keys = sorted({key for runs in requests.values() for r in runs for key in r})
    for key in keys:
        values = [median_of(kind, key) for kind in requests]
        if max(values) >= 0.01:
            table.add_row(key, *(f"{v:.2f}" for v in values))
    return table


def _verb_means(text: str) -> dict[str, tuple[int, float]]:
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for kind, store in (("_sum", sums), ("_count", counts)):
            prefix = "tessera_scheduler_verb_seconds" + kind + '{verb="'
            if line.startswith(prefix):
                verb = line[len(prefix) :].split('"', 1)[0]
                store[verb] = float(line.rsplit(" ", 1)[1])
    return {v: (int(counts[v]), sums[v] / max(counts[v], 1)) for v in counts}


if __name__ == "__main__":
    main()
