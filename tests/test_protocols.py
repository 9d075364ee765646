"""Named eval protocols: loading, hash pins, the pinned panel, and `agentrl eval --protocol` end to end.

The hash pins below are the point of the exercise: a protocol whose settings change must get a new name, so that a
result naming a protocol always means the same settings. The panel tests check that the tasks (and, with an engine
that seeds per request, the samples) do not depend on where the evaluation runs: runner count, engine replicas,
engine batch size.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import ROOT

from agentrl.config import ContextConfig, EngineConfig, RunnersConfig
from agentrl.protocols.protocol import ProtocolError, ProtocolRun, panel_fingerprint
from agentrl.protocols.registry import PROTOCOL_DIR, load_protocol, protocol_names
from agentrl.recipes.evaluate import EvalError, from_protocol

# name -> sha256 of its settings. A protocol is never edited under its name: copy it to a new name (say -v2), change
# that, and pin the new hash here; keep the old one, which results on record name.
PINNED = {
    "agentrl-alfworld-confirm-v1": "f3d2424a44792f3e2f80afbb2c08c0b84221c0690c38a08cab5130d5ea12e613",
    "agentrl-code-v1": "58f219eeac2dd66afc68543040bd17fffc0a8b6c36acf3ff8fb18f10085cc432",
    "agentrl-gui-confirm-v1": "a16d9e86f69849b420eb47c4e3b9dde9fbe211e9c1e0af2c83af26f8388122f4",
    "agentrl-math-main-v1": "5939d92c553c31be8e8847aac4db06b2c6378cad2993b402c59b95df8757051a",
    "agentrl-webshop-confirm-v1": "ada1e10a890ff0c258d0b2c5a5219416dc31c7879df7f86022c2a7653f33ed2d",
    "gigpo-alfworld-v1": "53850b86690fb130fa47cf0332728bbf993c4cc5ae3aca6ecb669a9d54a75bb0",
    "gigpo-webshop-v1": "b93f32b6f4b26b1760e944879082723aeaf7fdc781bda3d38604e2c42652d9b6",
}


def agentrl(*args):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


def test_every_shipped_protocol_keeps_its_pinned_hash():
    shipped = protocol_names()
    removed = sorted(set(PINNED) - set(shipped))
    assert not removed, f"protocols {removed} were removed: results on record name them; keep their files"
    for name in shipped:
        protocol = load_protocol(name)
        assert name in PINNED, (f"new protocol {name}: pin its hash in tests/test_protocols.py PINNED: "
                                f'"{name}": "{protocol.hash}"')
        assert protocol.hash == PINNED[name], (
            f"protocol {name} changed (hash {protocol.hash[:12]}, pinned {PINNED[name][:12]}): a changed protocol "
            f"gets a new name. Restore {name}.yaml, save the new settings as a new file (e.g. {name}-v2 or the next "
            f"version) and pin its hash")


def test_every_shipped_panel_still_gives_its_pinned_tasks():
    """The env version a protocol pins: the first observations of its panel, as this machine's envs give them."""
    for name in protocol_names():
        protocol = load_protocol(name)
        assert protocol.tasks.fingerprint, f"{name}: pin tasks.fingerprint (EvalProtocol.fingerprint_now())"
        assert protocol.fingerprint_now() == protocol.tasks.fingerprint, (
            f"env {protocol.env.id!r} no longer gives protocol {name}'s tasks: the env changed; results under the "
            f"new env need a protocol with a new name")


def test_shipped_protocols_carry_the_papers_settings():
    alfworld, webshop = load_protocol("gigpo-alfworld-v1"), load_protocol("gigpo-webshop-v1")
    assert alfworld.env.kwargs["max_steps"] == alfworld.env.max_turns == 50
    assert webshop.env.kwargs["max_steps"] == webshop.env.max_turns == 15
    for protocol in (alfworld, webshop):  # verl-agent's val_kwargs
        assert (protocol.sampling.temperature, protocol.sampling.top_p, protocol.sampling.top_k) == (0.4, 1.0, 0)
        assert "verl-agent" in json.dumps(protocol.provenance) and protocol.provenance["departures"]
    main = load_protocol("agentrl-math-main-v1")
    assert (main.env.id, main.env.split, main.tasks.seed_offset, main.tasks.count) == ("math", "test", 1_000_000, 64)


def test_the_code_protocol_evaluates_what_the_code_recipes_train():
    """agentrl-code-v1 plays the tasks, turns and token budget of configs/code-sft.yaml and code-rl.yaml, held out."""
    import yaml

    code = load_protocol("agentrl-code-v1")
    for recipe in ("code-sft", "code-rl"):
        config = yaml.safe_load((ROOT / "configs" / f"{recipe}.yaml").read_text())
        assert (code.env.id, dict(code.env.kwargs)) == (config["env"]["id"], config["env"]["kwargs"]), recipe
        assert code.env.max_turns == config["env"]["max_turns"] == code.env.kwargs["max_turns"], recipe
        assert code.context.max_new_tokens == config["sampling"]["max_new_tokens"], recipe
    # held out: the test split, and seeds past every seed the RL recipe trains on (20 steps x 4 tasks from 10,000)
    assert (code.env.split, code.tasks.seed_offset, code.tasks.count) == ("test", 1_000_000, 64)
    assert code.env_kwargs()["split"] == "test"


def _copy(tmp_path, name, edit):
    text = (PROTOCOL_DIR / f"{name}.yaml").read_text()
    path = tmp_path / "p.yaml"
    path.write_text(edit(text))
    return path


def test_the_hash_covers_settings_not_prose(tmp_path):
    original = load_protocol("gigpo-alfworld-v1")
    prose = load_protocol(_copy(tmp_path, "gigpo-alfworld-v1", lambda t: t.replace("ALFWorld as", "ALFWorld, as")))
    assert prose.hash == original.hash and prose.description != original.description
    hotter = load_protocol(_copy(tmp_path, "gigpo-alfworld-v1", lambda t: t.replace("temperature: 0.4",
                                                                                     "temperature: 0.7")))
    assert hotter.hash != original.hash
    longer = load_protocol(_copy(tmp_path, "gigpo-alfworld-v1", lambda t: t.replace("max_turns: 50", "max_turns: 40")))
    assert longer.hash != original.hash


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("  top_k: 0\n", ""), "missing top_k (a protocol writes every setting out)"),
    (lambda t: t.replace("  seed: 0\n", "  seed: 0\n  typical_p: 0.9\n"), "unknown typical_p"),
    (lambda t: t.replace("success: wilson", "success: wald"), "intervals.success must be wilson"),
    (lambda t: t.replace("ks: [1]", "ks: [4]"), "pass@4 needs samples_per_task >= 4"),
    (lambda t: t.replace("temperature: 0.4", "temperature: hot"), "sampling.temperature: expected a number"),
    (lambda t: t + "  - [unclosed\n", "not valid YAML"),
])
def test_a_bad_protocol_file_is_refused_with_one_clear_line(tmp_path, edit, message):
    with pytest.raises(ProtocolError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_protocol(_copy(tmp_path, "gigpo-alfworld-v1", edit))


def test_an_unknown_name_lists_the_available_ones():
    with pytest.raises(ProtocolError) as e:
        load_protocol("gigpo-alfworld")
    assert "unknown protocol 'gigpo-alfworld'; available: " in str(e.value)
    assert all(name in str(e.value) for name in protocol_names()) and "\n" not in str(e.value)


def test_the_panel_is_the_same_for_every_runner_engine_and_batch_count():
    """The tasks an evaluation plays are a function of the protocol alone; only where it runs differs."""
    run = ProtocolRun(load_protocol("gigpo-webshop-v1"))
    panels = set()
    for engines, runners, batch in ((1, 0, 32), (2, 0, 32), (1, 8, 32), (4, 32, 1), (1, 0, 7)):
        cfg = from_protocol(run, "tiny-qwen3", engine=EngineConfig(replicas=engines, batch_size=batch),
                            runners=RunnersConfig(count=runners))
        panels.add(tuple(cfg.env.seed_offset + i for i in range(cfg.episodes)))
        assert (cfg.env.kwargs, cfg.split, cfg.n, cfg.env.max_turns) == (run.protocol.env.kwargs, "test", 1, 15)
    assert panels == {run.protocol.tasks.seeds()}


class SeedEchoEngine:
    """A request engine whose reply depends only on the request's sampler seed, as vLLM's per-request seeding does.

    It replies ``\\boxed{d}`` with d the seed's last digit; `seen` records every request's seed and prompt.
    """

    def __init__(self, tokenizer):
        self.tokenizer, self.policy_version, self.pending, self.seen = tokenizer, 0, [], []
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def submit(self, request):
        self.pending.append(request)

    def poll(self, timeout=None):
        from agentrl.engine.base import EngineResult, Generation

        done, self.pending = self.pending, []
        out = []
        for r in done:
            self.seen.append((r.params.seed, r.prompt))
            ids = tuple(self.tokenizer(f"\\boxed{{{r.params.seed % 10}}}", add_special_tokens=False)["input_ids"])
            out.append(EngineResult(r.id, Generation(ids + (self.end,), tuple(-0.1 for _ in ids) + (-0.1,), "stop"), 0))
        return out

    def metrics(self):
        return {}

    def clear_cache(self):
        pass


def test_samples_do_not_depend_on_the_engine_batch_size(qwen3_tokenizer):
    """Evaluation plays the panel in chunks of whole tasks (sized by the engine's batch); an episode's sampler seed
    follows its place in the panel, so each task gets the same samples whatever the chunking."""
    from tqdm import tqdm

    from agentrl.recipes.evaluate import _collect, official_sampling
    from agentrl.rollout.pool import EnvMaker, LocalPool

    protocol = load_protocol("agentrl-math-main-v1")
    run = ProtocolRun(protocol, {"episodes": 6, "samples_per_task": 2})
    outcomes = []
    for batch in (1, 3, 32):  # chunks of 1, 3 and all 6 tasks
        cfg = from_protocol(run, "tiny-qwen3", engine=EngineConfig(kind="hf", batch_size=batch))
        cfg = replace(cfg, context=ContextConfig(max_context_tokens=cfg.max_context_tokens))  # as `evaluate` sets it
        resolved = official_sampling({}, "qwen3", thinking=False, fixed=protocol.sampling.values(),
                                     seed=cfg.seed, max_new_tokens=cfg.max_new_tokens)
        seeds = [cfg.env.seed_offset + i for i in range(cfg.episodes)]
        engine = SeedEchoEngine(qwen3_tokenizer)
        pool = LocalPool(EnvMaker("math", protocol.env_kwargs()), slots=16)
        trajectories, _ = _collect(cfg, seeds, resolved, engine, qwen3_tokenizer, pool, tqdm(disable=True), {})
        outcomes.append(sorted((t.group_id, t.seed, t.first_observation, t.turns[0].generated_ids, t.total_return)
                               for t in trajectories))
        assert len(trajectories) == 12 and len({s for s, _ in engine.seen}) == 12  # a seed per episode
    assert outcomes[0] == outcomes[1] == outcomes[2]
    assert len({o[3] for o in outcomes[0]}) == 10  # the replies differ by seed (its last digit)


def test_overrides_make_the_result_say_so():
    protocol = load_protocol("agentrl-math-main-v1")
    assert ProtocolRun(protocol).label == "agentrl-math-main-v1"
    run = ProtocolRun(protocol, {"episodes": 3, "sampling": {"temperature": 0.2}})
    assert run.label == "agentrl-math-main-v1 + overrides"
    cfg = from_protocol(run, "tiny-qwen3")
    assert (cfg.episodes, cfg.sampling_overrides, cfg.protocol) == (3, {"temperature": 0.2}, run)
    recorded = run.to_dict("f" * 64)
    assert recorded["name"] == protocol.name and recorded["hash"] == protocol.hash
    assert recorded["label"].endswith("+ overrides") and recorded["overrides"] == {"episodes": 3,
                                                                                    "sampling": {"temperature": 0.2}}
    with pytest.raises(EvalError, match="cannot override engine"):
        from_protocol(ProtocolRun(protocol, {"engine": "vllm"}), "tiny-qwen3")


def test_compare_names_a_protocol_difference():
    from agentrl.eval_compare import setting_differences

    base = {"env": {}, "model": {}, "tasks": {}, "sampling": {}}
    a = {**base, "protocol": {"label": "x", "hash": "a" * 64}}
    b = {**base, "protocol": {"label": "x + overrides", "hash": "a" * 64}}
    assert setting_differences(a, b) == [("protocol", "x (aaaaaaaaaaaa)", "x + overrides (aaaaaaaaaaaa)")]
    assert setting_differences(a, a) == [] and setting_differences(base, a)[0] == ("protocol", None, "x (aaaaaaaaaaaa)")


def test_cli_lists_protocols_and_refuses_bad_input_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    runner = CliRunner()  # in-process: nothing here loads a model
    out = runner.invoke(app, ["eval", "--list-protocols"])
    assert out.exit_code == 0 and all(name in out.stdout for name in protocol_names())
    assert load_protocol("gigpo-alfworld-v1").hash[:12] in out.stdout
    stale = _copy(tmp_path, "agentrl-math-main-v1", lambda t: t.replace("fingerprint: 4", "fingerprint: 5"))
    for args, message in [
        (("--protocol", "nope", "--model", "tiny-qwen3"), "unknown protocol 'nope'; available: agentrl-"),
        (("--protocol", "gigpo-alfworld-v1", "--env", "math", "--model", "tiny-qwen3"), "--env conflicts"),
        (("--protocol", "gigpo-alfworld-v1"), "needs --model"),
        (("--protocol", "gigpo-alfworld-v1", "--model", "tiny-qwen3", "--k", "1,x"), "'--k': expects comma-separated"),
        (("--protocol", str(stale), "--model", "tiny-qwen3"), "no longer gives the tasks protocol agentrl-math"),
    ]:
        out = runner.invoke(app, ["eval", *args])
        assert out.exit_code == 2, (args, out.output)
        assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)


def _tiny_protocol(tmp_path):
    """The main job's protocol cut to 3 tasks and 8 new tokens for the tiny model: a new name, its own fingerprint."""
    protocol = load_protocol("agentrl-math-main-v1")
    tiny = replace(protocol, name="tiny-math", tasks=replace(protocol.tasks, count=3),
                   context=replace(protocol.context, max_new_tokens=8))
    tiny = replace(tiny, tasks=replace(tiny.tasks, fingerprint=tiny.fingerprint_now()))
    text = (PROTOCOL_DIR / "agentrl-math-main-v1.yaml").read_text()
    text = (text.replace("name: agentrl-math-main-v1", "name: tiny-math").replace("count: 64", "count: 3")
            .replace("max_new_tokens: 256", "max_new_tokens: 8")
            .replace(protocol.tasks.fingerprint, tiny.tasks.fingerprint))
    path = tmp_path / "tiny-math.yaml"
    path.write_text(text)
    assert load_protocol(path).hash == tiny.hash
    return path, tiny


def _eval(path, out_dir, *extra):
    out = agentrl("eval", "--protocol", str(path), "--model", "tiny-qwen3", "--output", str(out_dir), *extra)
    assert out.returncode == 0, out.stderr[-2000:]
    return out, json.loads((out_dir / "results.json").read_text())


def test_eval_with_a_protocol_end_to_end(tmp_path):
    path, tiny = _tiny_protocol(tmp_path)
    out, results = _eval(path, tmp_path / "eval")
    recorded = results["protocol"]
    assert (recorded["name"], recorded["hash"], recorded["label"]) == ("tiny-math", tiny.hash, "tiny-math")
    assert recorded["panel_fingerprint"] == recorded["pinned_fingerprint"] == tiny.tasks.fingerprint
    assert sorted(e["seed"] for e in results["episodes"]) == list(tiny.tasks.seeds())
    sampling = results["sampling"]
    # The protocol's sampling, not the model's generation_config (Qwen3's official T=0.6, top_p=0.95, top_k=20).
    assert (sampling["temperature"], sampling["top_p"], sampling["top_k"]) == (1.0, 1.0, 0)
    assert sampling["sources"]["temperature"] == sampling["sources"]["max_new_tokens"] == "protocol tiny-math"
    assert all(e["tokens"] <= 8 for e in results["episodes"])
    assert "protocol tiny-math (" in out.stdout
    assert f"Protocol <b>tiny-math</b> (hash {tiny.hash[:12]}" in (tmp_path / "eval" / "report.html").read_text()


@pytest.mark.slow
def test_the_same_panel_with_ray_runners_and_two_engines(tmp_path):
    """The tiny protocol again with 2 Ray runners and 2 engine actors, plus an override: the same tasks, a label that
    says "+ overrides" (about 1 min here)."""
    path, tiny = _tiny_protocol(tmp_path)
    _, local = _eval(path, tmp_path / "local")
    _, spread = _eval(path, tmp_path / "spread", "--runners", "2", "--engines", "2", "--engine", "hf", "--seed", "3")
    for results in (local, spread):
        assert results["protocol"]["panel_fingerprint"] == tiny.tasks.fingerprint
        assert sorted(e["seed"] for e in results["episodes"]) == list(tiny.tasks.seeds())
    assert spread["engine"]["engines"] == 2 and spread["protocol"]["label"] == "tiny-math + overrides"
    assert spread["protocol"]["overrides"] == {"seed": 3}


def test_panel_fingerprint_reads_the_first_observations():
    import agentrl

    env = agentrl.make("math", split="test")
    assert panel_fingerprint(env, [1, 2]) == panel_fingerprint(env, [1, 2]) != panel_fingerprint(env, [2, 1])
