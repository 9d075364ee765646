"""Rollouts: episodes played by the policy, in groups, against policy versions.

The training loop sees one interface, `driver.RolloutDriver`, and two drivers implement it: the scheduler that pairs
the built-in agent loop (`loop`) over the env runner pool (`pool`) with policy versions (`scheduler`, with its
`buffer` of finished groups), and agent functions written against the OpenAI API playing through the policy server
of `agentrl.serve` (`agents`, loaded by `agent_loader`).
"""
