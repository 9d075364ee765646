"""The trainer's parts, one concept per module; the training loop itself is `agentrl.recipes.train`.

* `backend`: the `TrainingBackend` protocol and the typed requests / results that cross it.
* `single`: the single-process backend (model and AdamW in the driver).
* `fsdp`: FSDP2 over N Ray trainer workers.
* `placement`: where trainers and engines go (one Ray placement group, checked before anything starts).
* `checkpoint`: the checkpoint folder (HF-format weights + sharded optimizer state) and exact resume.
* `routing_replay`: Routing Replay as a strategy chosen once per run.
* `logprobs`: log-probs and entropy without a full `[B, T, V]` logits tensor.
* `microbatch`: `MicroBatch`, collation and token-budget packing.
* `packing`: padding-free forward passes (samples back to back in one row, attention confined to each).
* `precision`: bf16 compute with float32 master weights, chosen by what the hardware does natively.
* `memory`: the peak-memory estimate that decides gradient checkpointing and refuses configs that cannot fit.
* `metrics`: the step's metrics line.
"""
