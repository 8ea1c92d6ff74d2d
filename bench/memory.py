"""The extender's memory on a large cluster: what it keeps per pod, and a list's peak.

    .venv/bin/python bench/memory.py                          # 1,000 nodes, 40,000 pods
    .venv/bin/python bench/memory.py --nodes 5000 --pods 200000

The extender's state (``SchedulerState``) holds ``--nodes`` nodes of 8 cards; its pod
handler then books a list of ``--pods`` bound pods, each 1,000 MiB / 10 % of a card with
its assignment, dressed as the API server serves a running Deployment's pod (managed
fields, a service account volume, status and conditions: ~4 KB of JSON each, where the
other benches' pods are 0.6 KB). The list comes as the API server serves a paged list,
500 pods a page, inside ``listing()`` as the extender lists (scheduler/heap.py), two
ways, each in a process of its own (freed memory stays with a process):

* **decoded whole** (before): every page decoded, then the whole list handed to the
  handler (``replace``), then let go;
* **a page at a time** (now): each page decoded as the handler asks for it
  (``replace_pages``) and emptied when it asks for the next.

Then the GPU map (``--web``) is built once, and (paged only) the list is read again as
``kubectl tessera why`` reads it, keeping each pod's placed form (view/eligible.py).
Resident memory (VmRSS) is read before and after each step, and sampled every 10 ms
during it for the peak. Rows:

* **decoded list** (the anchor): the pods as decoded JSON, what a cache of the pod
  objects would keep (an informer's, or an extender that kept the objects);
* **kept after the list**: what the process keeps resident once the list is booked;
* **peak during the list**: the most the list needed above what was resident before;
* **peak of a map build**: the same for one build of the GPU map;
* **placed forms kept**: what ``kubectl tessera why`` keeps of the list beside its state.

The bench holds the list's JSON text throughout; it is in every "before" and so in no
difference. Freed memory is not always handed back to the system, so "kept" is what the
process keeps resident, not only what the state references. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _full import spread_cluster
from _machine import describe
from rich.console import Console
from rich.table import Table

from tessera.kube.reflector import let_go
from tessera.scheduler.heap import freeze_listed, listing
from tessera.scheduler.state import SchedulerState
from tessera.scheduler.web import map_body
from tessera.view.eligible import placed_form

PAGE = 4096
PAGE_SIZE = 500  # the reflector's page (kube/reflector.py)
MODES = {"whole": "decoded whole (before)", "paged": "a page at a time (now)"}


def resident() -> int:
    """This process's resident memory, bytes (Linux: /proc/self/statm)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE


def peak_of(step: Callable[[], object]) -> tuple[int, int, int]:
    """(resident before, after, and the most while ``step`` ran)."""
    gc.collect()
    before = resident()
    most = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            most[0] = max(most[0], resident())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        step()
    finally:
        done.set()
        sampler.join()
    gc.collect()
    after = resident()
    return before, after, max(most[0], after)


def as_served(pod: dict[str, Any], j: int) -> dict[str, Any]:
    """``pod`` with what the API server adds to a running Deployment's pod (each value
    its own, as no two pods share a name, an address or a time)."""
    meta, spec = pod["metadata"], pod["spec"]
    when = f"2026-11-27T{j // 3600 % 24:02d}:{j // 60 % 60:02d}:{j % 60:02d}Z"
    ip = f"10.{j >> 16 & 255}.{j >> 8 & 255}.{j & 255}"
    meta |= {
        "generateName": "infer-5d8f7c9b6-",
        "creationTimestamp": when,
        "labels": {"app": "infer", "pod-template-hash": "5d8f7c9b6"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": "infer-5d8f7c9b6", "uid": f"rs-{j % 97}",
                             "controller": True, "blockOwnerDeletion": True}],
        "managedFields": [
            {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
             "time": when, "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {
                 ".": {}, "f:app": {}, "f:pod-template-hash": {}}, "f:ownerReferences": {}},
                 "f:spec": {"f:containers": {'k:{"name":"main"}': {
                     ".": {}, "f:image": {}, "f:name": {}, "f:resources": {}}}}}},
            {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": when,
             "fieldsType": "FieldsV1", "subresource": "status",
             "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {},
                                       "f:hostIP": {}, "f:phase": {}, "f:podIP": {},
                                       "f:startTime": {}}}},
        ],
    }  # fmt: skip
    main = spec["containers"][0]
    main |= {
        "env": [{"name": "MODEL", "value": "llama"}, {"name": "PORT", "value": "8080"},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "volumeMounts": [{"name": f"kube-api-access-{j % 100000:05d}", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }  # fmt: skip
    main["resources"]["requests"] = dict(main["resources"]["limits"])
    spec |= {
        "volumes": [{"name": f"kube-api-access-{j % 100000:05d}", "projected": {
            "defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt",
                               "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst", "serviceAccountName": "default",
        "serviceAccount": "default", "securityContext": {}, "priority": 0,
        "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300}],
    }  # fmt: skip
    pod["status"] = {
        "phase": "Running", "hostIP": f"192.168.{j % 250}.{j % 200}", "podIP": ip,
        "podIPs": [{"ip": ip}], "startTime": when, "qosClass": "BestEffort",
        "conditions": [{"type": kind, "status": "True", "lastProbeTime": None,
                        "lastTransitionTime": when}
                       for kind in ("PodReadyToStartContainers", "Initialized", "Ready",
                                    "ContainersReady", "PodScheduled")],
        "containerStatuses": [{
            "name": "main", "ready": True, "restartCount": 0, "started": True,
            "image": "infer:1.4", "imageID": f"sha256:{j:064x}",
            "containerID": f"containerd://{j:064x}",
            "state": {"running": {"startedAt": when}}, "lastState": {}}],
    }  # fmt: skip
    return pod


def measure(mode: str, nodes: int, pods: int) -> dict[str, float]:
    """One process's figures, bytes: the list taken ``mode`` ("whole" or "paged")."""
    node_objs, listed = spread_cluster(nodes, pods)
    # The list as the API server serves it, in pages of the reflector's size; "whole"
    # decodes every page before the handler sees any, as the reflector did.
    texts = [
        json.dumps([as_served(p, j) for j, p in enumerate(listed[i : i + PAGE_SIZE], i)])
        for i in range(0, len(listed), PAGE_SIZE)
    ]
    del listed
    held: list[object] = []
    before, after, _ = peak_of(lambda: held.append([json.loads(t) for t in texts]))
    decoded = after - before
    held.clear()
    state = SchedulerState()
    state.replace_nodes(node_objs)

    def pages() -> Iterator[list[Any]]:
        for text in texts:
            page = json.loads(text)
            yield page
            page.clear()  # as the reflector empties a page once the next is asked for

    def book() -> None:
        with listing():
            if mode == "paged":
                state.pods_handler.replace_pages(pages())
            else:
                items = [o for page in pages() for o in page]
                state.pods_handler.replace(items)
                let_go(items)
            freeze_listed()

    before, after, most = peak_of(book)
    t0 = time.perf_counter()
    map_before, _, map_most = peak_of(lambda: map_body(state))
    map_s = time.perf_counter() - t0
    forms = 0
    if mode == "paged":  # the same list again, as kubectl tessera why keeps it
        kept: list[object] = []
        forms_before, forms_after, _ = peak_of(
            lambda: kept.extend(f for page in pages() for p in page if (f := placed_form(p)))
        )
        forms = forms_after - forms_before
    return {
        "forms": forms,
        "decoded": decoded,
        "kept": after - before,
        "peak": most - before,
        "map": map_most - map_before,
        "map_s": map_s,
        "json": sum(map(len, texts)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=40_000)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.nodes, args.pods)))
        return
    runs = {}
    for mode in MODES:  # each in a fresh process: freed memory stays with a process
        print(f"{args.nodes:,} nodes, {args.pods:,} pods, the list {MODES[mode]} ...", flush=True)
        out = subprocess.run(
            [sys.executable, __file__, "--child", mode, f"--nodes={args.nodes}",
             f"--pods={args.pods}"], check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        runs[mode] = json.loads(out.strip().splitlines()[-1])
    whole = runs["whole"]
    t = Table(title=f"Extender memory: {args.nodes:,} nodes x 8 cards, {args.pods:,} pods, "
              f"{whole['json'] / 2**20:,.0f} MiB of JSON ({describe()})")  # fmt: skip
    for col in ("what", "MiB", "KiB a pod", "of the decoded list"):
        t.add_column(col, justify="right")
    rows = [("decoded list (anchor)", whole["decoded"])]
    for mode, r in runs.items():
        rows += [
            (f"{MODES[mode]}: kept after the list", r["kept"]),
            (f"{MODES[mode]}: peak during the list", r["peak"]),
            (f"{MODES[mode]}: peak of a map build ({r['map_s']:.1f} s)", r["map"]),
        ]
    rows.append(("kubectl tessera why: placed forms kept", runs["paged"]["forms"]))
    for what, size in rows:
        t.add_row(what, f"{size / 2**20:,.0f}", f"{size / 1024 / args.pods:.1f}",
                  f"{size / whole['decoded']:.2f}x")  # fmt: skip
    Console(width=120).print(t)


if __name__ == "__main__":
    main()
