from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tessera.errors import FormatError
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


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_the_host_layout_is_the_documented_one(tmp_path: Path) -> None:
    """docs/protocol.md, "Files on the host": the folders under the state directory,
    each file's bytes and mode."""
    layout = Layout(tmp_path)
    assert (layout.lib_root, layout.containers, layout.claims) == (
        tmp_path / "lib", tmp_path / "containers", tmp_path / "claims")  # fmt: skip
    assert (layout.mps_pipe, layout.mps_log) == (tmp_path / "mps/pipe", tmp_path / "mps/log")
    r = AllocRecord("abc", ("GPU-a::0",), "uid", "ns", "p", "c", ("GPU-a",), True, "v1", 2.5)
    layout.write_alloc(r, "version=1\n")
    d = tmp_path / "containers" / "abc"
    assert (layout.limits_path("abc"), layout.region_path("abc"), layout.allowance_path("abc")) == (
        d / "etc/limits", d / "usage/region", d / "allowance/allowance")  # fmt: skip
    assert _mode(d / "usage") == 0o777  # the container's processes, any uid
    assert _mode(d / "meta.json") == 0o600
    assert (d / "meta.json").read_text() == (
        '{"allocId": "abc", "cards": ["GPU-a"], "confirmed": true, "container": "c", '
        '"created": 2.5, "lib": "v1", "pod": {"name": "p", "namespace": "ns", "uid": "uid"}, '
        '"slots": ["GPU-a::0"], "v": 1}\n'
    )
    assert layout.read_allocs() == [r]  # confirmed kept
    layout.write_claim("claim-uid", "version=1\n", '{"v": 1}')
    c = tmp_path / "claims" / "claim-uid"
    assert _mode(c / "usage") == 0o777 and _mode(c / "etc/limits") == 0o444
    assert layout.read_claim_meta("claim-uid") == '{"v": 1}\n'
    assert layout.claim_uids() == ["claim-uid"] and layout.read_claim_meta("gone") is None
    layout.remove_claim("claim-uid")
    layout.remove_claim("claim-uid")  # already gone: nothing to do
    assert layout.claim_uids() == []


def test_library_folders_modes_and_what_lists_as_a_version(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    lib = tmp_path / "libvgpu.so"
    lib.write_bytes(b"v1")
    v1 = layout.install_library(lib)
    assert v1 == "3bfc269594ef6492"  # the first 16 hex digits of SHA-256(b"v1")
    assert _mode(layout.lib_dir(v1)) == 0o755 and _mode(layout.lib_dir(v1) / "libvgpu.so") == 0o755
    (layout.lib_root / ".half-copied").mkdir()  # another agent's temp folder
    assert layout.install_library(None) == "none"
    assert (layout.lib_dir("none") / "ld.so.preload").read_text() == ""
    assert layout.lib_versions() == sorted([v1, "none"])
    layout.remove_lib("none")
    layout.remove_lib("none")
    assert layout.lib_versions() == [v1]
    layout.remove_alloc("never-made")  # nothing to do, no error


def test_a_record_that_does_not_read_is_logged_and_the_rest_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layout = Layout(tmp_path)
    good = rec("zz", "v1")
    layout.write_alloc(good, "version=1\n")
    broken = layout.containers / "aa"  # sorts first
    broken.mkdir()
    (broken / "meta.json").write_text('{"v": 2}')
    (layout.containers / "half").mkdir()  # Allocate died before the record: not logged
    with caplog.at_level(logging.WARNING, "tessera.node.formats.layout"):
        assert layout.read_allocs() == [good]
    assert [r.getMessage() for r in caplog.records] == [
        f"{broken / 'meta.json'}: unknown version 2; this Tessera reads v1; its folder is "
        "kept: remove it once its container is gone"
    ]
    assert layout.alloc_ids() == ["aa", "half", "zz"]
    assert [layout.has_record(a) for a in ("aa", "half", "zz")] == [True, False, True]


def test_a_record_that_does_not_read_names_the_file_and_the_rule() -> None:
    def refusal(text: str) -> str:
        with pytest.raises(FormatError) as info:
            AllocRecord.from_json("/s/containers/x/meta.json", text)
        return str(info.value)

    assert refusal('{"v": 2}') == (
        "/s/containers/x/meta.json: unknown version 2; this Tessera reads v1")  # fmt: skip
    assert refusal('{"v": 1}') == (
        "/s/containers/x/meta.json: not a valid allocation record: 'allocId'")  # fmt: skip
