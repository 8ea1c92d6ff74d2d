"""How a ``tessera`` command stops on what it cannot use: one line on stderr,
``tessera COMMAND: error: MESSAGE``, and an exit code (1: the machine or the cluster;
2: the command line, as Click's own usage errors)."""

from __future__ import annotations

from typing import NoReturn

import typer

__all__ = ["exit_with_error"]


def exit_with_error(command: str, message: str, code: int = 1) -> NoReturn:
    typer.echo(f"tessera {command}: error: {message}", err=True)
    raise typer.Exit(code)
