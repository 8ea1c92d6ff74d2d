"""The limits file: round trips, the byte format, and every rule's error message."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tessera.errors import FormatError
from tessera.model.types import CardSlice, ComputePolicy, ContainerAssignment
from tessera.node.formats.limits import (
    LIMITS_PATH,
    CardLimit,
    Limits,
    LimitsFiles,
    decode_limits,
    encode_limits,
    limits_for,
)

U0 = "GPU-3a1f0c52-9b7e-4c1d-8e2a-5f6b7c8d9e01"
U1 = "GPU-77c0ffee-0000-4000-8000-00000000beef"

TWO = Limits(
    cards=(
        CardLimit(0, U0, 8192, 30, ComputePolicy.FIXED_SHARE),
        CardLimit(1, U1, 4096, 20, ComputePolicy.BURST_SHARE),
    ),
    region="/var/run/tessera/usage/region",
    allowance="/var/run/tessera/allowance/allowance",
)

EXPECTED = """\
# written by the tessera node agent; read-only in the container
version=1
region=/var/run/tessera/usage/region
allowance=/var/run/tessera/allowance/allowance
cards=2
card.0.uuid=GPU-3a1f0c52-9b7e-4c1d-8e2a-5f6b7c8d9e01
card.0.memory_mib=8192
card.0.cores_percent=30
card.0.policy=fixed-share
card.1.uuid=GPU-77c0ffee-0000-4000-8000-00000000beef
card.1.memory_mib=4096
card.1.cores_percent=20
card.1.policy=burst-share
"""


def test_path_is_the_fixed_read_only_location() -> None:
    assert LIMITS_PATH == "/etc/tessera/limits"


def test_encode_is_the_documented_bytes() -> None:
    assert encode_limits(TWO) == EXPECTED


def test_round_trip() -> None:
    assert decode_limits(encode_limits(TWO)) == TWO


@pytest.mark.parametrize("policy", list(ComputePolicy))
def test_round_trip_each_policy(policy: ComputePolicy) -> None:
    cores = 0 if policy is ComputePolicy.BEST_EFFORT else 55
    lim = Limits(cards=(CardLimit(0, U0, 1, cores, policy),))
    assert decode_limits(encode_limits(lim)) == lim


def test_sixteen_cards_round_trip() -> None:
    cards = tuple(
        CardLimit(
            i, f"GPU-00000000-0000-0000-0000-{i:012x}", 1024 + i, i + 1, ComputePolicy.FIXED_SHARE
        )
        for i in range(16)
    )
    lim = Limits(cards=cards)
    assert decode_limits(encode_limits(lim)) == lim


def test_decoder_ignores_unknown_keys_comments_and_order() -> None:
    text = (
        "version=1\n# comment\n\ncard.0.policy=best-effort\nfuture.key=x\ncards=1\n"
        f"card.0.uuid={U0}\ncard.0.cores_percent=0\ncard.0.memory_mib=10\nregion=/r\n"
    )
    lim = decode_limits(text)
    assert lim.cards == (CardLimit(0, U0, 10, 0, ComputePolicy.BEST_EFFORT),)
    assert lim.region == "/r"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "missing 'version'"),
        ("cards=1\nversion=1\n", "line 1: the first key must be 'version'"),
        ("version=2\n", "unknown version '2'"),
        ("version=1\nversion=1\n", "line 2: key 'version' given twice"),
        ("version=1\n\n# note\nnoequals\n", "line 4: expected key=value"),
        ("version=1\r\n", "line 1: carriage return"),
        (EXPECTED.replace("cards=2", "cards=17"), "cards: 17 is outside 1..16"),
        (EXPECTED.replace("cards=2", "cards=-1"), "cards: not a decimal integer"),
        (EXPECTED.replace("cards=2", "cards=3"), "missing key 'card.2.policy'"),
        (EXPECTED.replace("=8192", "=0"), "card.0.memory_mib: 0 is outside"),
        (EXPECTED.replace("=8192", "=8k"), "card.0.memory_mib: not a decimal integer"),
        (EXPECTED.replace("cores_percent=30", "cores_percent=101"), "outside 0..100"),
        (EXPECTED.replace("cores_percent=30", "cores_percent=0"), "fixed-share needs 1..100"),
        (EXPECTED.replace("=fixed-share", "=hard"), "'hard' is not one of"),
        (EXPECTED.replace(U1, U0), "listed twice"),
        (EXPECTED.replace(U0, "GPU-xyz"), "not a GPU UUID"),
        (EXPECTED.replace("region=/var", "region=var"), "region: must be an absolute path"),
        (EXPECTED.replace("allowance=/var/run/tessera/allowance/allowance\n", ""), "allowance"),
    ],
)
def test_bad_input_names_the_rule(text: str, message: str) -> None:
    with pytest.raises(FormatError, match="limits file") as info:
        decode_limits(text)
    assert message in str(info.value)


def test_encoder_refuses_what_the_decoder_would() -> None:
    bad = Limits(cards=(CardLimit(0, U0, 0, 10, ComputePolicy.FIXED_SHARE),))
    with pytest.raises(FormatError, match="memory_mib"):
        encode_limits(bad)
    with pytest.raises(FormatError, match="out of order"):
        encode_limits(Limits(cards=(CardLimit(1, U0, 1, 10, ComputePolicy.FIXED_SHARE),)))
    with pytest.raises(FormatError, match=r"need 1\.\.16"):
        encode_limits(Limits(cards=()))
    with pytest.raises(FormatError, match=r"cores_percent: must be 0\.\.100, got 101"):
        encode_limits(Limits(cards=(CardLimit(0, U0, 1, 101, ComputePolicy.FIXED_SHARE),)))


def test_the_ends_of_each_range_round_trip() -> None:
    whole = Limits(cards=(CardLimit(0, U0, 1, 100, ComputePolicy.FIXED_SHARE),),
                   context_mib=1 << 20)  # fmt: skip
    assert decode_limits(encode_limits(whole)) == whole


def test_limits_for_follows_the_assignment_and_card_order() -> None:
    a = ContainerAssignment(
        name="main",
        slices=(CardSlice(U0, 8192, 30), CardSlice(U1, 4096, 30)),
        policy=ComputePolicy.BURST_SHARE,
    )
    lim = limits_for(a, card_order=[U1, U0], region="/r", allowance="/a")
    assert lim.cards == (
        CardLimit(0, U1, 4096, 30, ComputePolicy.BURST_SHARE),
        CardLimit(1, U0, 8192, 30, ComputePolicy.BURST_SHARE),
    )
    assert (lim.region, lim.allowance) == ("/r", "/a")
    assert decode_limits(encode_limits(lim)) == lim


def test_limits_for_exclusive_best_effort_and_no_cores() -> None:
    excl = ContainerAssignment("x", (CardSlice(U0, 81920, 100),), exclusive=True)
    assert limits_for(excl).cards[0] == CardLimit(0, U0, 81920, 100, ComputePolicy.FIXED_SHARE)
    be = ContainerAssignment("b", (CardSlice(U0, 100, 40),), policy=ComputePolicy.BEST_EFFORT)
    assert limits_for(be).cards[0].cores_percent == 0
    none = ContainerAssignment("n", (CardSlice(U0, 100, 0),))
    assert limits_for(none).cards[0].policy is ComputePolicy.BEST_EFFORT


def test_limits_for_refuses_a_foreign_card_order() -> None:
    a = ContainerAssignment("main", (CardSlice(U0, 1, 1),))
    with pytest.raises(FormatError, match="card_order"):
        limits_for(a, card_order=[U1])


def test_context_charge_is_written_only_when_set_and_round_trips() -> None:
    charged = Limits(TWO.cards, TWO.region, TWO.allowance, context_mib=300)
    text = encode_limits(charged)
    assert "context_mib=300\n" in text and "context_mib" not in encode_limits(TWO)
    assert decode_limits(text) == charged
    assert decode_limits(EXPECTED).context_mib == 0  # absent: nothing charged


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("context_mib=1048577", "context_mib: 1048577 is outside 0..1048576"),
        ("context_mib=1G", "context_mib: not a decimal integer"),
    ],
)
def test_a_bad_context_charge_names_the_key_and_the_rule(line: str, message: str) -> None:
    with pytest.raises(FormatError, match=re.escape(message)):
        decode_limits(EXPECTED + line + "\n")
    with pytest.raises(FormatError, match=re.escape("context_mib: must be 0..1048576, got -1")):
        encode_limits(Limits(TWO.cards, TWO.region, TWO.allowance, context_mib=-1))


def test_limits_for_carries_the_agents_context_charge() -> None:
    a = ContainerAssignment("main", (CardSlice(U0, 8192, 30),), ComputePolicy.FIXED_SHARE)
    assert limits_for(a, context_mib=256).context_mib == 256
    assert limits_for(a).context_mib == 0


def test_a_limits_file_is_parsed_again_only_when_it_changes(tmp_path: Path) -> None:
    # PreStartContainer may correct a file under a reader (the exporter, the burst
    # coordinator): the new limits must reach it; an unchanged file is not parsed again.
    path = tmp_path / "limits"
    path.write_text(EXPECTED)
    os.utime(path, ns=(1, 1_000))
    files = LimitsFiles()
    first = files.read(path)
    assert first == TWO and files.read(path) is first
    corrected = Limits(TWO.cards[:1], TWO.region, TWO.allowance)
    path.write_text(encode_limits(corrected))
    os.utime(path, ns=(1, 2_000))
    assert files.read(path) == corrected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty: missing 'version'"),
        (EXPECTED.replace("cores_percent=30", "cores_percent=101"),
         "card.0.cores_percent: 101 is outside 0..100"),
        (EXPECTED.replace("=fixed-share", "=hard"),
         "card.0.policy: 'hard' is not one of fixed-share, burst-share, best-effort"),
        (EXPECTED.replace("allowance=/var/run/tessera/allowance/allowance\n", ""),
         "missing key 'allowance' (a card is burst-share)"),
        (EXPECTED.replace("=8192", f"={(1 << 40) + 1}"),
         "card.0.memory_mib: 1099511627777 is outside 1..1099511627776"),
        (EXPECTED.replace("region=/var/run/tessera/usage/region", "region=/r\ncontext_mib=-1"),
         "context_mib: not a decimal integer: '-1'"),
        (EXPECTED.replace("allowance=/var", "allowance=var"),
         "allowance: must be an absolute path on one line"),
    ],
)  # fmt: skip
def test_a_refusal_is_the_file_the_key_and_the_rule(text: str, message: str) -> None:
    with pytest.raises(FormatError) as info:
        decode_limits(text)
    assert str(info.value) == f"limits file: {message}"


def test_the_encoder_refuses_with_the_whole_message() -> None:
    def refusal(limits: Limits) -> str:
        with pytest.raises(FormatError) as info:
            encode_limits(limits)
        return str(info.value)

    one = CardLimit(0, U0, 1, 10, ComputePolicy.FIXED_SHARE)
    assert refusal(Limits(cards=())) == "limits file: cards: need 1..16 cards, got 0"
    assert refusal(Limits(cards=(CardLimit(1, U0, 1, 10, ComputePolicy.FIXED_SHARE),))) == (
        "limits file: card.0: ordinal 1 out of order; cards run 0..n-1")  # fmt: skip
    assert refusal(Limits(cards=(CardLimit(0, U0, 0, 10, ComputePolicy.FIXED_SHARE),))) == (
        "limits file: card.0.memory_mib: must be >= 1, got 0")  # fmt: skip
    assert refusal(Limits(cards=(CardLimit(0, U0, 1, 101, ComputePolicy.FIXED_SHARE),))) == (
        "limits file: card.0.cores_percent: must be 0..100, got 101")  # fmt: skip
    assert refusal(Limits(cards=(one,), context_mib=-1)).startswith(
        "limits file: context_mib: must be 0.."
    )
    assert refusal(Limits(cards=(one,), allowance="/a\n/b")) == (
        "limits file: allowance: must be an absolute path on one line")  # fmt: skip


def test_a_value_may_hold_an_equals_sign() -> None:
    odd = Limits(TWO.cards, region="/run/a=b/region", allowance=TWO.allowance)
    assert decode_limits(encode_limits(odd)).region == "/run/a=b/region"


def test_an_exclusive_container_gets_whole_compute_uncapped_whatever_its_policy() -> None:
    burst = ContainerAssignment("x", (CardSlice(U0, 81920, 30),), ComputePolicy.BURST_SHARE,
                                exclusive=True)  # fmt: skip
    assert limits_for(burst).cards == (CardLimit(0, U0, 81920, 100, ComputePolicy.FIXED_SHARE),)
