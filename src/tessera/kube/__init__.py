"""Tessera kube."""
