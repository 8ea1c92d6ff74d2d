"""``tessera scheduler``: a flag it cannot use is told at once, by name, before the
process reaches the API server (no kubeconfig is given here, so reaching for one would
fail with another message)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli import app
from tessera.scheduler.tls import generate_serving_cert


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["scheduler", *args])
    return result.exit_code, " ".join(result.stderr.replace("│", " ").split())


@pytest.mark.parametrize(
    ("args", "told"),
    [
        (["--policy", "tightest"], "Invalid value for --policy: placement: must be one of"),
        (["--compat", "hami,volcano"], "Invalid value for --compat: unknown ['volcano']"),
        (["--tls-cert", "tls.crt"], "give both --tls-cert and --tls-key, or neither"),
        (["--reservation-ttl", "0"], "'--reservation-ttl': Input should be greater than or"),
        (["--port", "70000"], "'--port': Input should be less than or equal to 65535"),
    ],
)
def test_a_bad_flag_is_told_by_name(args: list[str], told: str) -> None:
    code, err = _run(*args)
    assert code == 2 and told in err, err


def test_a_certificate_that_does_not_load_is_told_before_the_api(tmp_path: Path) -> None:
    first = generate_serving_cert(tmp_path / "a", ["localhost"])
    second = generate_serving_cert(tmp_path / "b", ["localhost"])
    for cert, key in [
        (tmp_path / "none.crt", first.key_file),  # a wrong path
        (first.cert_file, second.key_file),  # a key of another certificate
    ]:
        code, err = _run("--tls-cert", str(cert), "--tls-key", str(key))
        assert code == 2, err
        assert f"Invalid value for --tls-cert/--tls-key: {cert} and {key} do not load" in err
