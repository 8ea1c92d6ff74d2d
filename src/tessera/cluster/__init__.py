"""Cluster state: nodes, cards and bookings, updated by events; O(1) snapshots."""

from tessera.cluster.booking import Booking
from tessera.cluster.snapshot import CardFree, Snapshot
from tessera.cluster.state import ClusterState

__all__ = ["Booking", "CardFree", "ClusterState", "Snapshot"]
