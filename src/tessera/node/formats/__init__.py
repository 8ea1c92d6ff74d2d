"""Files the agent and libvgpu share, byte for byte as docs/protocol.md gives them:
the limits file, the usage region, the allowance file, and the host layout."""
