"""Tessera node."""
