"""The port's two small readers of an object's metadata, which every adapter leans on."""

from __future__ import annotations

import pytest

from tessera.kube.port import object_name, resource_version


@pytest.mark.parametrize(
    ("obj", "name", "version"),
    [
        ({"metadata": {"name": "gpu-1", "resourceVersion": "42"}}, "gpu-1", "42"),
        ({"metadata": {"name": None, "resourceVersion": None}}, "", ""),
        ({"metadata": None}, "", ""),
        ({}, "", ""),
        (None, "", ""),
    ],
)
def test_metadata_readers_give_empty_text_for_what_is_missing(
    obj: dict[str, object] | None, name: str, version: str
) -> None:
    assert object_name(obj) == name
    assert resource_version(obj) == version
