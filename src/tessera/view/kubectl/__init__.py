"""``kubectl tessera``: the cluster's GPUs as an operator asks about them.

    kubectl tessera top [-n NS] [--model M] [--sort-by node|free|memory|cores] [-o wide|json|yaml]
    kubectl tessera pod NAME [-n NS] [-o json|yaml]
    kubectl tessera why NAME [-n NS]
    kubectl tessera quota [-n NS | -A] [-o wide|json|yaml]
    kubectl tessera capacity [--model M] [-o json|yaml]   (per model: free, allocated, out)
    kubectl tessera cordon NODE CARD...       (CARD: a UUID or an index on the node)
    kubectl tessera uncordon NODE [CARD...]   (no CARD: every card of the node)
    kubectl tessera drain NODE CARD... [--timeout S]   (cordon, then evict the cards' pods)

Installed as the ``kubectl-tessera`` executable (kubectl finds plugins on PATH). Reads
Nodes, Pods, Events, GpuQuotas, and (for the cards on the claims path) ResourceSlices
and ResourceClaims; ``cordon``, ``uncordon`` and ``drain`` patch one Node's
``tessera.io/cordoned-cards`` annotation, and ``drain`` evicts the pods on those cards
(view/cordon.py). All through the user's
kubeconfig, with kubectl's ``--kubeconfig``, ``--context`` and ``-n`` habits. Live use
(memory in use, achieved compute) comes from Prometheus when ``--prometheus URL`` is
given (the node agents' exporter, docs/operations.md); without it the views show
allocation only.
"""

from __future__ import annotations

import gc
import sys

import typer

from tessera.kube.errors import ApiError, Gone
from tessera.view.kubectl import capacity, cordon, quota, top, why
from tessera.view.kubectl.common import api_failure, app

# In the order `kubectl tessera --help` lists them.
for _command in (top.top, top.pod, why.why, quota.quota, capacity.capacity,
                 cordon.cordon, cordon.uncordon, cordon.drain):  # fmt: skip
    app.command()(_command)

__all__ = ["app", "main"]


def main() -> None:
    """The ``kubectl-tessera`` entry point."""
    # A command lists the cluster, answers and exits. The collector's passes over the
    # listed objects (none in a cycle) were a third of `why` at 200,000 pods; what a
    # command drops is freed by reference counting, the rest at exit.
    gc.disable()
    # A paged list of pods whose version the API server compacts before its last page is
    # Gone. Every command lists before it prints or writes, so it is listed again from the
    # start, once (client-go's pager falls back to one unpaged list, gigabytes here).
    for attempt in (1, 2):
        try:
            app(prog_name="kubectl tessera")  # exits (SystemExit) when the command ends
            return
        except ApiError as exc:  # a sentence, not a traceback, as kubectl says it
            if isinstance(exc, Gone) and attempt == 1:
                typer.echo(f"note: a list expired before its end ({exc}); listing again", err=True)
                continue
            typer.echo(f"error: {api_failure(exc)}", err=True)
            sys.exit(1)
