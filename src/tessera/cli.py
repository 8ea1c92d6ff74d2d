"""`tessera ...`: one Typer app; each part registers its own sub-commands here."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="tessera",
    help="Kubernetes GPU sharing: placement, simulation, scheduler, node agent.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def version() -> None:
    """Print Tessera's version."""
    from tessera import __version__

    typer.echo(__version__)


from tessera.simulate.cli import simulate  # noqa: E402  (light: heavy imports are lazy)

# One line in the command list: the command's own help says the protocol in full.
app.command(
    "simulate", short_help="Replay a GPU trace per placement policy, report GPU allocation."
)(simulate)


from tessera.testenv.cli import app as dev_cluster_app  # noqa: E402

app.add_typer(dev_cluster_app, name="dev-cluster")


from tessera.node.cli import node_agent  # noqa: E402  (light: the agent's imports are lazy)

app.command("node-agent")(node_agent)


from tessera.scheduler.cli import scheduler  # noqa: E402  (heavy imports are lazy)

app.command("scheduler")(scheduler)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
