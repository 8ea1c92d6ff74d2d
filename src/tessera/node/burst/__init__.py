"""Burst-share coordination: lending a card's idle compute between its tenants."""
