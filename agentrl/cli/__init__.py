"""The `agentrl` command line: `agentrl.cli.main` names the commands, one module per command (or pair) does each.

``agentrl`` (the script) and ``python -m agentrl.cli`` both run `agentrl.cli.main.main`. `agentrl.cli.common` holds
what the commands share (exit codes, the one-line error), `agentrl.cli.flags` generates the flags of ``run``, ``sft``,
``eval``, ``serve`` and ``env serve`` from their config dataclasses, `agentrl.cli.doctor` is ``agentrl doctor``'s
report.
"""
