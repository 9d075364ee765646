"""Episode rewards beyond the env's rules: a judge model's score, and how it combines with the rule reward.

`judge` asks a judge model through any OpenAI-compatible chat-completions endpoint (``agentrl serve`` included) to
score a finished episode by a rubric template, with a cache (also on disk in the run folder, so a resume does not pay
again), retries with backoff, per-call timeouts and a per-run budget; `combine` weighs the judge's score against the
env's rule reward and gates which episodes the judge sees. The rollout loop (`agentrl.rollout.loop`) asks the judge
as each episode ends, so a training run's rollouts, lockstep and async alike, get judged rewards the same way; an
episode whose score could not be obtained is counted and its group dropped, never scored 0. ``agentrl eval`` asks a
judge when given one (``--reward.judge.*``; a run folder's only with ``--reward-from-run``), else its scores are the
env's rule rewards. Configured by the run's ``reward`` section (`agentrl.config.RewardConfig`).
"""
