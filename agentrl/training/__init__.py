"""Training that outgrows one process: backends behind one interface, checkpoints, placement, Routing Replay.

* `backend`: the `TrainingBackend` protocol and the typed requests / results that cross it.
* `single`: the single-process backend (model and AdamW in the driver).
* `fsdp`: FSDP2 over N Ray trainer workers.
* `placement`: where trainers and engines go (one Ray placement group, checked before anything starts).
* `checkpoint`: the checkpoint folder (HF-format weights + sharded optimizer state) and exact resume.
* `replay`: Routing Replay as a strategy chosen once per run.
* `metrics`: the step's metrics line.
"""
