from __future__ import annotations

from pathlib import Path

from tessera.node.formats.layout import AllocRecord, Layout


def rec(alloc_id: str, lib: str) -> AllocRecord:
    return AllocRecord(alloc_id, ("GPU-a::0",), "uid", "ns", "p", "c", ("GPU-a",), False, lib, 1.0)


def test_library_is_installed_once_per_content(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "state")
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"v1")
    v1 = layout.install_library(lib)
    assert layout.install_library(lib) == v1
    assert (layout.lib_dir(v1) / "libvgpu.so").read_bytes() == b"v1"
    assert (
        layout.lib_dir(v1) / "ld.so.preload"
    ).read_text() == "/usr/local/tessera/lib/libvgpu.so\n"
    lib.write_bytes(b"v2")
    v2 = layout.install_library(lib)
    assert v2 != v1 and layout.lib_versions() == sorted([v1, v2])
    assert (layout.lib_dir(v1) / "libvgpu.so").read_bytes() == b"v1"  # untouched
    assert layout.install_library(None) == "none"


def test_allocation_folders_round_trip(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    r = rec("abc", "v1")
    layout.write_alloc(r, "version=1\n")
    d = layout.alloc_dir("abc")
    assert (d / "etc" / "limits").read_text() == "version=1\n"
    assert (d / "etc" / "limits").stat().st_mode & 0o777 == 0o444
    assert (d / "usage").is_dir() and (d / "allowance").is_dir()
    assert layout.read_allocs() == [r]
    (layout.containers / "half-made").mkdir()
    assert layout.read_allocs() == [r]  # a folder without a record is skipped
    layout.remove_alloc("abc")
    assert layout.read_allocs() == []
