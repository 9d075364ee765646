"""Experiment trackers: a run's metrics, config, sampled trajectories and eval results, also in W&B, MLflow, ...

metrics.jsonl and curves.png are always written; `log.trackers` (``--log wandb --log tensorboard``, or
``--log wandb,tensorboard``) adds trackers, each chosen by name from `registry.TRACKERS` and installed as an extra
(``pip install 'agentrl-platform[wandb]'``). Every tracker writes under the run folder and contacts no server unless
its own environment variable asks for one:

=============  ======================================================  ==============================================
tracker        writes                                                  to reach a server instead
=============  ======================================================  ==============================================
wandb          ``RUN/wandb/offline-run-*`` (offline mode)              ``WANDB_MODE=online``, or ``wandb sync`` later
mlflow         ``RUN/mlruns`` (a file store)                           ``MLFLOW_TRACKING_URI``
tensorboard    ``RUN/tensorboard`` (event files)                       (none: ``tensorboard --logdir RUN/tensorboard``)
trackio        ``RUN/trackio`` (Trackio's SQLite store)                ``TRACKIO_DIR``, ``TRACKIO_SPACE_ID``
=============  ======================================================  ==============================================

Modules:
    * `agentrl.trackers.base`: the `Tracker` protocol each tracker module implements, `TrackerSettings`, `Table`.
    * `agentrl.trackers.registry`: `TRACKERS`, name -> ``module:Class``, and `tracker_names` (``--log a,b``).
    * `agentrl.trackers.runlog`: `RunLog`, the one place a run's rows go (metrics.jsonl, then every tracker).
    * `agentrl.trackers.tables`: the trajectory and eval tables and the eval summary the trackers are handed.
    * one module per tracker: `wandb`, `mlflow`, `tensorboard`, `trackio`.

This folder imports nothing else of agentrl: `agentrl.config` imports its registry, and ``tests/test_layout.py``
keeps the arrow from running back up.
"""
