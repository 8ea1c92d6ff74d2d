"""The node's cards: discovery backends (NVML, fake), health, the inventory annotation."""
