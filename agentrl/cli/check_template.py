"""`agentrl check-template`: a chat template against the official file, turn by turn (`agentrl.chat.roundtrip`)."""

from __future__ import annotations

from pathlib import Path

import typer

from agentrl.cli.common import fail

__all__ = ["check_template"]


def check_template(
    model: str = typer.Option(..., "--model", help="Built-in model, local HF folder or hub id."),
    conversations: Path | None = typer.Option(None, "--conversations",
                                              help="JSON/JSONL conversations or a run's trajectories.jsonl."),
    family: str | None = typer.Option(None, "--family", help="Force a template family instead of detecting it."),
    thinking: bool | None = typer.Option(None, "--thinking/--no-thinking", help="Template thinking switch."),
) -> None:
    """Check a chat template: parity with the official file, which turns rewrite history and why, token drift."""
    from agentrl.chat.families import UnknownFamilyError
    from agentrl.chat.roundtrip import template_report
    from agentrl.models import UnknownModelError

    try:
        report = template_report(model, conversations, family=family, enable_thinking=thinking)
    except (UnknownModelError, UnknownFamilyError, ValueError) as e:
        fail(str(e))
    for line in report.lines():
        typer.echo(line)
    raise typer.Exit(0 if report.incremental_ok else 1)
