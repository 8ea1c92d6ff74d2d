"""The kubelet's gRPC APIs (device plugin v1beta1, pod-resources v1) as generated Python.

The ``.proto`` files and the generated ``*_pb2.py`` live in ``v1beta1/``; regenerate
with ``.venv/bin/python -m tessera.node.deviceplugin.generate``.
"""
