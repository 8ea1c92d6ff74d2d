"""The claims path's preparer on its own: what it writes for a claim, what it reads back
after a restart, and what its sweep removes and keeps.

The integration suite drives it over the real DRA gRPC protocol; this one reaches what
that suite leaves unread (the agent's context charge and visibility in a claim's files,
names read back at a restart, one bad folder among good ones). Real Layout (a temporary
folder); the claims come from FakeKube through the agent's own ``KubeClaims``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tessera.claims.devices import DRIVER
from tessera.kube.errors import Unavailable
from tessera.kube.fake import FakeKube
from tessera.kube.kinds import RESOURCE_CLAIMS
from tessera.model.clusterspec import make_cards
from tessera.model.types import CardSlice
from tessera.node.dra.prepare import ClaimPreparer, PrepareError
from tessera.node.formats.layout import LIMITS_IN_FOLDER, Layout
from tessera.node.formats.limits import decode_limits
from tessera.node.isolation import Visibility
from tessera.node.kube_source import KubeClaims
from tests.unit._claims import claim as a_claim

NODE = "node-a"
CARDS = make_cards(NODE, 2, "A100")
U1 = CARDS[1].uuid


def claim(kube: FakeKube, name: str, pool: str = NODE, memory: str = "2Gi") -> dict[str, Any]:
    """A claim allocated 20 % of card 1 and ``memory`` on ``pool``, as the API server has it."""
    obj = a_claim(name, memory=memory, device="gpu-1", pool=pool, ns="team", compute="20")
    return kube.seed(RESOURCE_CLAIMS, obj, "team")


def uid(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def preparer(
    root: Path,
    kube: FakeKube,
    visibility: Visibility = Visibility.ENV,
    context_mib: int = 0,
    cdi_dir: Path | None = None,
    layout: Layout | None = None,
) -> ClaimPreparer:
    return ClaimPreparer(NODE, CARDS, layout or Layout(root / "state"), "v1", KubeClaims(kube),
                         cdi_dir or root / "cdi", visibility=visibility,
                         context_mib=context_mib)  # fmt: skip


def spec_env(root: Path, claim_uid: str) -> dict[str, str]:
    spec = json.loads((root / "cdi" / f"{DRIVER}-claim_{claim_uid}.json").read_text())
    [device] = spec["devices"]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


# --- prepare -----------------------------------------------------------------------------


def test_a_claims_files_carry_the_agents_context_charge_and_its_own_id(tmp_path: Path) -> None:
    kube = FakeKube()
    c = claim(kube, "a")
    p = preparer(tmp_path, kube, context_mib=300)
    [device] = p.prepare("team", "a", uid(c))
    assert device.cdi_ids == (f"{DRIVER}/claim={uid(c)}",)
    limits = decode_limits((p.layout.claim_dir(uid(c)) / LIMITS_IN_FOLDER).read_text())
    assert (limits.context_mib, [x.memory_mib for x in limits.cards]) == (300, [2048])
    env = spec_env(tmp_path, uid(c))
    assert env["TESSERA_ALLOC_ID"] == f"claim-{uid(c)}"  # what `tessera top` shows
    assert env["NVIDIA_VISIBLE_DEVICES"] == U1


def test_under_cdi_visibility_the_card_is_named_as_nvidias_cdi_device(tmp_path: Path) -> None:
    kube = FakeKube()
    c = claim(kube, "a")
    cdi_dir = tmp_path / "run" / "cdi"  # made with its parents on the first prepare
    p = preparer(tmp_path, kube, visibility=Visibility.CDI, cdi_dir=cdi_dir)
    [device] = p.prepare("team", "a", uid(c))
    assert device.cdi_ids == (f"{DRIVER}/claim={uid(c)}", f"nvidia.com/gpu={U1}")
    assert (cdi_dir / f"{DRIVER}-claim_{uid(c)}.json").exists()


def test_a_claim_made_again_under_another_uid_is_refused(tmp_path: Path) -> None:
    kube = FakeKube()
    claim(kube, "a")
    with pytest.raises(PrepareError) as err:
        preparer(tmp_path, kube).prepare("team", "a", "old-uid")
    assert str(err.value).startswith("ResourceClaim team/a has UID ")
    assert str(err.value).endswith(
        ", kubelet asked for old-uid: the claim was deleted and made again"
    )


def test_the_meta_file_is_the_documented_json(tmp_path: Path) -> None:
    kube = FakeKube()
    c = claim(kube, "a", memory="3Gi")
    p = preparer(tmp_path, kube)
    p.prepare("team", "a", uid(c))
    text = p.layout.read_claim_meta(uid(c))
    assert text is not None
    assert json.loads(text) == {
        "v": 1,
        "claim": {"uid": uid(c), "namespace": "team", "name": "a"},
        "cards": [U1],
        "slices": [{"uuid": U1, "memoryMiB": 3072, "coresPercent": 20}],
        "lib": "v1",
    }
    # Keys sorted, one line: the same bytes at every prepare of the claim.
    assert text == json.dumps(json.loads(text), sort_keys=True) + "\n"


# --- a restart ---------------------------------------------------------------------------


def test_a_restarted_preparer_knows_its_claims_by_name_and_skips_a_garbled_one(
    tmp_path: Path,
) -> None:
    kube = FakeKube()
    a, b = claim(kube, "a"), claim(kube, "b", memory="1Gi")
    first = preparer(tmp_path, kube)
    first.prepare("team", "a", uid(a))
    first.prepare("team", "b", uid(b))
    garbled = first.layout.claim_dir(uid(b)) / "meta.json"
    garbled.write_text(json.dumps({"claim": {"namespace": "team", "name": "b"}}))  # no slices
    again = preparer(tmp_path, kube)
    assert again.prepared_claims() == [(uid(a), "team", "a", (U1,))]
    assert again.held_by_claim() == {("team", "a"): (CardSlice(U1, 2048, 20),)}


def test_every_claims_library_is_kept_whatever_folder_sorts_first(tmp_path: Path) -> None:
    kube = FakeKube()
    c = claim(kube, "a")
    p = preparer(tmp_path, kube)
    p.prepare("team", "a", uid(c))
    for broken, text in (("0-no-meta", None), ("1-bad-json", "{"), ("2-no-lib", "{}")):
        p.layout.claim_dir(broken).mkdir(parents=True)
        if text is not None:
            (p.layout.claim_dir(broken) / "meta.json").write_text(text)
    assert p.lib_versions() == {"v1"}


# --- sweep -------------------------------------------------------------------------------


def test_sweep_goes_past_a_claim_it_cannot_tell_about(tmp_path: Path) -> None:
    kube = FakeKube()
    claims = {name: claim(kube, name) for name in ("a", "b", "c")}
    p = preparer(tmp_path, kube)
    for name, c in claims.items():
        p.prepare("team", name, uid(c))
    for name in claims:
        kube.delete(RESOURCE_CLAIMS, name, "team")
    # The first claim asked about cannot be answered for; the others are gone.
    kube.fail_next("get", Unavailable(503, "ServiceUnavailable", "etcd is away"))
    removed = p.sweep(now=1e12, grace_s=60)
    assert len(removed) == 2 and set(removed) < {uid(c) for c in claims.values()}
    assert len(p.prepared()) == 1


def test_sweep_goes_past_a_half_written_folder_its_spec_keeps(tmp_path: Path) -> None:
    kube = FakeKube()
    gone = claim(kube, "gone")
    p = preparer(tmp_path, kube)
    p.prepare("team", "gone", uid(gone))
    kube.delete(RESOURCE_CLAIMS, "gone", "team")
    half = "0-half"  # sorts before the real UID
    p.layout.claim_dir(half).mkdir(parents=True)
    (tmp_path / "cdi" / f"{DRIVER}-claim_{half}.json").write_text("{}")
    assert p.sweep(now=1e12, grace_s=60) == [uid(gone)]
    assert p.prepared() == [half]


def test_sweep_keeps_a_folder_until_it_is_older_than_the_grace(tmp_path: Path) -> None:
    kube = FakeKube()
    c = claim(kube, "a")
    p = preparer(tmp_path, kube)
    p.prepare("team", "a", uid(c))
    kube.delete(RESOURCE_CLAIMS, "a", "team")
    written = p.layout.claim_dir(uid(c)).stat().st_mtime
    assert p.sweep(now=written + 59.5, grace_s=60) == []
    assert p.sweep(now=written + 60, grace_s=60) == [uid(c)]
    assert (p.prepared(), p.prepared_claims(), p.held_by_claim()) == ([], [], {})


def test_sweep_asks_again_who_uses_a_claim_after_the_api_server_says_it_is_gone(
    tmp_path: Path,
) -> None:
    """Pods the sweep looked at first may be older than the API server's answer: a pod
    that started using the claim in between keeps it."""
    kube = FakeKube()
    c = claim(kube, "a")
    p = preparer(tmp_path, kube)
    p.prepare("team", "a", uid(c))
    kube.delete(RESOURCE_CLAIMS, "a", "team")
    looks: list[set[tuple[str, str]]] = [set(), {("team", "a")}]
    assert p.sweep(now=1e12, grace_s=60, in_use=lambda: looks.pop(0)) == []
    assert (looks, p.prepared()) == ([], [uid(c)])
    assert p.sweep(now=1e12, grace_s=60, in_use=set) == [uid(c)]


class _PausedLayout(Layout):
    """A Layout whose claim writes stop between making the folder and its files, as a
    slow disk would, and which tells when a reader found that folder still empty."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.made, self.go, self.read_empty = (threading.Event() for _ in range(3))

    def write_claim(self, uid: str, limits_text: str, meta_json: str) -> None:
        self.claim_dir(uid).mkdir(parents=True)
        self.made.set()
        assert self.go.wait(5)
        super().write_claim(uid, limits_text, meta_json)

    def read_claim_meta(self, uid: str) -> str | None:
        text = super().read_claim_meta(uid)
        if text is None and self.made.is_set():
            self.read_empty.set()
        return text


def test_a_sweep_at_a_grace_of_0_keeps_a_prepare_it_found_half_written(tmp_path: Path) -> None:
    """The sweep reads a folder whose prepare has made it but not yet written meta.json:
    it looks like one that never finished. It must not remove it once the prepare is done."""
    kube = FakeKube()
    c = claim(kube, "a")
    layout = _PausedLayout(tmp_path / "state")
    p = preparer(tmp_path, kube, layout=layout)
    swept: list[str] = []
    prepare = threading.Thread(target=p.prepare, args=("team", "a", uid(c)))
    sweep = threading.Thread(target=lambda: swept.extend(p.sweep(now=1e12, grace_s=0)))
    prepare.start()
    assert layout.made.wait(5)
    sweep.start()
    assert layout.read_empty.wait(5)
    layout.go.set()
    prepare.join(5)
    sweep.join(5)
    assert (swept, p.prepared()) == ([], [uid(c)])
    assert p.held_by_claim() == {("team", "a"): (CardSlice(U1, 2048, 20),)}
    assert (tmp_path / "cdi" / f"{DRIVER}-claim_{uid(c)}.json").exists()
