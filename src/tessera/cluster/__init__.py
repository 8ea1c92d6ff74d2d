"""Tessera cluster."""
