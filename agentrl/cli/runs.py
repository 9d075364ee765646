"""The commands that read finished or running runs: `agentrl inspect` (text) and `agentrl view` (a browser)."""

from __future__ import annotations

from pathlib import Path

import typer

from agentrl.cli.common import fail

__all__ = ["inspect_", "view_"]


def inspect_(
    run_dir: Path = typer.Argument(..., help="A run folder (holds trajectories.jsonl, metrics.jsonl)."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write a PNG of the distribution shifts here."),
    every: int = typer.Option(1, "--every", help="Show every N-th step (the last one is always shown)."),
) -> None:
    """Summarise a run's saved trajectories step by step: reward and length distributions and how they shift."""
    from agentrl.recipes.inspect_run import InspectError, inspect_run

    try:
        inspect_run(run_dir, plot=plot, every=every)
    except InspectError as e:
        fail(str(e))


def view_(
    runs: list[Path] = typer.Argument(..., help="Run folders (of `agentrl run` or `agentrl eval`); two or more are "
                                               "overlaid and compared."),
    export: Path | None = typer.Option(None, "--export", help="Write one self-contained HTML file here instead of "
                                                              "serving."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; any other than loopback needs --token."),
    port: int = typer.Option(8100, help="Port (0 picks a free one)."),
    token: str = typer.Option("", "--token", envvar="AGENTRL_VIEW_TOKEN", show_default=False,
                              help="Token the browser must present (open /?token=TOKEN once; env var "
                                   "AGENTRL_VIEW_TOKEN)."),
    allowed_host: list[str] = typer.Option(
        [], "--allowed-host", help="Another name the browser may call the viewer by (repeatable; '*' allows any)."),
) -> None:
    """See inside runs in a browser, live: curves, episodes turn by turn, every token's mask, log-probs and weights."""
    from agentrl.view import ViewError, export_html, serve_view

    try:
        if export is not None:
            typer.echo(f"exported to {export_html(runs, export)}")
            return
        serve_view(runs, host=host, port=port, token=token, extra_hosts=allowed_host, say=typer.echo)
    except ViewError as e:
        fail(str(e))
