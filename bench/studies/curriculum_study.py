"""A curriculum against uniform task sampling, RL from one SFT checkpoint, across run seeds (issue 44 item 5).

    python bench/studies/curriculum_study.py --env gui                    # the study: 2 arms x seeds 0, 1
    python bench/studies/curriculum_study.py --env gui --smoke --init smollm2-135m   # 1 step per arm, 8 held-out
                                                          # tasks, seed 0, from the base model (no SFT), into
                                                          # runs/curriculum_gui_smoke/
    python bench/studies/curriculum_study.py --env gui --smoke --init tiny-qwen3 --engine hf --engine-dtype float32
                                                          # the same with a random tiny model, in about 2 minutes
    python bench/studies/curriculum_study.py --env gui --plot-only        # redraw the figure from the JSON

One SFT checkpoint (``configs/<env>-sft.yaml``, trained once into ``<work>/sft`` unless it is there), then RL runs
from it with ``configs/<env>-rl.yaml`` (the recipe: GiGPO, dynamic sampling without refill, lr 2e-5, 4 tasks x 8
episodes a step), ``--steps`` steps, vLLM in bfloat16, one run per arm and run seed:

- ``uniform``: the recipe as shipped: each step's tasks are new seeds in order, task types as the env draws them;
- ``success``: ``--curriculum.policy success`` with its defaults (over the env's difficulty levels, band [0.2, 0.8],
  window 8, explore 0.1; `agentrl.curriculum`): a level whose recent groups succeed between 20% and 80% of the time
  (or that was never played) is drawn with weight 1, any other with weight 0.1, so steps play more of what makes
  mixed groups. On the phone GUI the levels are its three task types.

Every checkpoint is evaluated on the same ``--episodes`` held-out tasks (seeds from ``--seed-offset``: 4,000,000, no
earlier study used them) into ``<work>/seed<S>/<arm>/eval``. The comparison (primary: held-out success) is ``success
- uniform``, runs paired by seed; "the curriculum is better" (or worse) is claimed only where the paired interval
excludes 0. Per step, beside the common metrics (`seeded_arms`), the curriculum's own. Runs go seed by seed and are
resumable (`seeded_arms.main`). Writes docs/results/curriculum_<env>.json and .png.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seeded_arms import ArmStudy, main  # noqa: E402

STUDY = ArmStudy(
    name="curriculum",
    arms={"uniform": [], "success": ["--curriculum.policy", "success"]},
    treatment="success",
    baseline="uniform",
    seed_offset=4_000_000,
    default_seeds=(0, 1),
    per_step=("curriculum_levels_mixed", "curriculum_level_mean"),
    curves=(("success_rate", "train success"), ("curriculum_level_mean", "mean level played (0 = easiest)"),
            ("step_seconds", "step seconds")),
    title="uniform tasks against the 'success' curriculum",
)

if __name__ == "__main__":
    main(STUDY)
