"""The API resources Tessera touches, declared as data (group/version, plural, scope)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEVICE_CLASSES",
    "EVENTS",
    "GPUQUOTAS",
    "LEASES",
    "NODES",
    "PODS",
    "POD_DISRUPTION_BUDGETS",
    "RESOURCE_CLAIMS",
    "RESOURCE_CLAIM_TEMPLATES",
    "RESOURCE_SLICES",
    "Kind",
]


@dataclass(frozen=True, slots=True)
class Kind:
    """One API resource: where it lives and whether it is namespaced."""

    api_version: str  # "v1" or "group/version"
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        """The API group ("" for the core group's ``v1``)."""
        return self.api_version.rpartition("/")[0]

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection (``name`` None) or of one object."""
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return base if name is None else f"{base}/{name}"


NODES = Kind("v1", "Node", "nodes", namespaced=False)
NAMESPACES = Kind("v1", "Namespace", "namespaces", namespaced=False)
PODS = Kind("v1", "Pod", "pods", namespaced=True)
POD_DISRUPTION_BUDGETS = Kind(
    "policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", namespaced=True
)
EVENTS = Kind("v1", "Event", "events", namespaced=True)
LEASES = Kind("coordination.k8s.io/v1", "Lease", "leases", namespaced=True)
GPUQUOTAS = Kind("tessera.io/v1alpha1", "GpuQuota", "gpuquotas", namespaced=True)
RESOURCE_SLICES = Kind("resource.k8s.io/v1", "ResourceSlice", "resourceslices", namespaced=False)
RESOURCE_CLAIMS = Kind("resource.k8s.io/v1", "ResourceClaim", "resourceclaims", namespaced=True)
RESOURCE_CLAIM_TEMPLATES = Kind(
    "resource.k8s.io/v1", "ResourceClaimTemplate", "resourceclaimtemplates", namespaced=True
)
DEVICE_CLASSES = Kind("resource.k8s.io/v1", "DeviceClass", "deviceclasses", namespaced=False)
