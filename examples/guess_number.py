r"""The README's own environment, GuessNumber ("Your own environment"), as a file to play and train.

The code below is the README's block as printed there (tests/test_examples.py keeps the two the same). From the
repository root:

    agentrl play --env examples/guess_number.py:GuessNumber --expert --seed 0    # expert_action plays one episode
    agentrl run --env examples/guess_number.py:GuessNumber --model tiny-qwen3 --engine hf --steps 1 \
        --prompts-per-step 2 --group-size 2 --max-turns 2 --max-new-tokens 8 --output runs/guess-smoke   # smoke, ~15 s
    agentrl run --env examples/guess_number.py:GuessNumber --runners 8 --output runs/guess    # SmolLM2-135M, 8 runners

The smoke run names the HF engine: vLLM's CPU build does not serve tiny-qwen3's head size, and naming the engine
skips the seconds `auto` spends importing vLLM to find that out. The file reaches Ray's env runners with the job, so
`--runners 8` needs no packaging. `examples/served_env.sh` serves this env over HTTP and trains on it from another
process.
"""

import agentrl


class GuessNumber(agentrl.TextEnv):
    """Guess a number between 1 and 100; the env says higher or lower."""

    system_prompt = "Reply with a single integer."

    def reset(self, *, seed=None, options=None):
        """Pick the secret; return the first observation and an info dict."""
        super().reset(seed=seed)  # seeds self.np_random: same seed, same episode
        self.secret, self.tries = int(self.np_random.integers(1, 101)), 0
        return "I picked a number between 1 and 100.", {}

    def step(self, action):
        """Score one guess: (observation, reward, terminated, truncated, info)."""
        self.tries += 1
        try:
            guess = int(action.strip())
        except ValueError:  # unparseable: say why, reward 0, go on
            return "Please reply with an integer.", 0.0, False, self.tries >= 10, {"success": False}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {"success": True}
        hint = "higher" if guess < self.secret else "lower"
        return f"{hint}.", 0.0, False, self.tries >= 10, {"success": False}

    def expert_action(self):
        """The perfect move (`agentrl play --expert`, SFT demonstrations)."""
        return str(self.secret)


agentrl.register("guess-number", entry_point=GuessNumber)
env = agentrl.make("guess-number")
