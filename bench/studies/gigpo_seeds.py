"""GiGPO against GRPO with three training seeds per arm, RL from one SFT checkpoint (issue 44 item 5).

    python bench/studies/gigpo_seeds.py --env gui                      # the study: 2 arms x seeds 0, 1, 2
    python bench/studies/gigpo_seeds.py --env gui --smoke --init tiny-qwen3 --engine hf --engine-dtype float32
                                                          # 1 step per arm, 8 held-out tasks, seed 0, a random tiny
                                                          # model, into runs/gigpo_seeds_gui_smoke/
    python bench/studies/gigpo_seeds.py --env gui --plot-only          # redraw the figure from the JSON

The single-seed comparison (`gigpo_vs_grpo.py`, issue 32) again, across run seeds: the main job's five-seed spread
(0.64-0.84) showed one seed is not enough to compare methods. Arms, from the same SFT checkpoint with
``configs/<env>-rl.yaml``, identical but for the advantage:

- ``grpo``: ``--advantage.estimator grpo``: (R - group mean) / std over the task's group, every turn of an episode
  credited alike;
- ``gigpo``: the recipe as shipped: that episode part plus GiGPO's step part over anchor states (gamma 0.95, step
  weight 1).

Held-out tasks from seed 5,000,000 (no earlier study used them). ``gigpo - grpo`` held-out success, runs paired by
seed, is the comparison (`seeded_arms.main`). Every run also logs, per step, what GiGPO's step groups have to work
with: the fraction of the turns left in the loss whose anchor state another turn of its group shares
(``step_groups_shared_frac``) and the fraction in a step group whose returns differ (``step_groups_mixed_frac``: at
most the turns whose step advantage is not 0). Writes docs/results/gigpo_seeds_<env>.json and .png.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seeded_arms import ArmStudy, main  # noqa: E402

STUDY = ArmStudy(
    name="gigpo_seeds",
    arms={"grpo": ["--advantage.estimator", "grpo"], "gigpo": []},
    treatment="gigpo",
    baseline="grpo",
    seed_offset=5_000_000,
    default_seeds=(0, 1, 2),
    per_step=("step_groups_shared_frac", "step_groups_mixed_frac"),
    curves=(("success_rate", "train success"), ("step_groups_mixed_frac", "turns in a mixed step group"),
            ("step_seconds", "step seconds")),
    title="GRPO against GiGPO",
)

if __name__ == "__main__":
    main(STUDY)
