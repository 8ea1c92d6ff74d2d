"""Tessera: Kubernetes GPU sharing with two-level (node and card) placement."""

__version__ = "0.1.0"
__all__ = ["__version__"]
