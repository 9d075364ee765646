"""Named eval protocols: everything a comparison between two evaluations depends on, fixed under one name.

Agent RL numbers are hard to compare because the settings behind them drift: step limits (ALFWorld 50 vs 40 steps),
eval temperatures, and task panels that change with the number of workers. A protocol pins all of it, as data: the
env and its arguments (step limit included), the split, the task panel (its seeds and a fingerprint of the tasks
they give, which is the env's version as far as the panel is concerned), the model calls per episode, the context
and token budgets, every sampling setting and the sampler seed, the samples per task, and the interval methods.
``agentrl eval --protocol NAME`` runs one; its ``results.json`` names the protocol and its hash.

The shipped protocols are the YAML files in this folder, one per name, the file named after the protocol. A
protocol's hash (`EvalProtocol.hash`) covers every setting after loading, not the description or the provenance: a
protocol whose settings change must get a new name (``tests/test_protocols.py`` pins each shipped hash, so a changed
file under an old name fails there with a message saying so).

Modules:
    * `agentrl.protocols.protocol`: `EvalProtocol` and its parts, `ProtocolRun` (a protocol with overrides),
      `panel_fingerprint`, `ProtocolError`.
    * `agentrl.protocols.registry`: the shipped protocols (`PROTOCOL_DIR`, `protocol_names`), `load_protocol` (a
      name or a file, every key checked) and the ``--list-protocols`` `listing`.
"""
