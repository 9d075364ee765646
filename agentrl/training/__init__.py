"""The trainer's parts: log-probs without full logits, token-budget micro-batches, memory planning.

The training loop itself is `agentrl.train`; these modules are the pieces it composes.
"""
