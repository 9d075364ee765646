"""Rollouts: episodes played by the policy, in groups, against policy versions.

The agent loop (`loop`), the env runner pool (`pool`), and the scheduler that pairs rollouts with policy versions
(`scheduler`, with its `buffer` of finished groups).
"""
