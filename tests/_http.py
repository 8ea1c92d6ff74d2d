"""A plain GET as a probe or a browser sees it: an error status is an answer too."""

from __future__ import annotations

from urllib.error import HTTPError
from urllib.request import urlopen


def get(url: str, timeout_s: float = 10.0) -> tuple[int, str, str]:
    """(status, Content-Type, text) of GET ``url``, whatever the status."""
    try:
        with urlopen(url, timeout=timeout_s) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except HTTPError as err:
        with err:
            return err.code, err.headers["Content-Type"], err.read().decode()
