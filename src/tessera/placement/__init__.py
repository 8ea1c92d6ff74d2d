"""Tessera placement."""
