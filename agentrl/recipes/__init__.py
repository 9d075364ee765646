"""The recipes the commands run, each read top to bottom.

`train` (RL), `sft`, `evaluate`, `play`, `inspect_run`; `report` renders evaluation results.
"""
