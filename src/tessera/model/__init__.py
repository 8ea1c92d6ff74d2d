"""Tessera's data model: pure values and the codecs of its annotations."""

from tessera.model.names import ResourceNames
from tessera.model.types import (
    Assignment,
    Card,
    CardSlice,
    ComputePolicy,
    ContainerAssignment,
    ContainerRequest,
    GpuRequest,
    NodeInventory,
    PodRequest,
)

__all__ = [
    "Assignment",
    "Card",
    "CardSlice",
    "ComputePolicy",
    "ContainerAssignment",
    "ContainerRequest",
    "GpuRequest",
    "NodeInventory",
    "PodRequest",
    "ResourceNames",
]
