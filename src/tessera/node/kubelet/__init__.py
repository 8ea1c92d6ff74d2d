"""What kubelet talks to: the device plugin server, slot IDs, the pod-resources client."""
