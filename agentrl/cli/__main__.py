"""`python -m agentrl.cli`: the same as the `agentrl` command."""

from agentrl.cli.main import main

main()
