"""The chat stack: how an episode becomes tokens and how tokens become training samples.

- `families`: the model families' chat templates (the official files live in the top-level `templates/`) and each
  family's history-rewrite rule;
- `parsers`: replies into text and tool calls, per family;
- `context`: the prompt of every turn, token-in/token-out (`ChatContext`);
- `layout`: how a rollout's turns lay out as tokens;
- `samples`: trajectories into training samples with per-turn loss masks;
- `roundtrip`: template checks (parity with the official file, history rewrites, token drift).
"""
