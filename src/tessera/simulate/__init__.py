"""Tessera simulate."""
