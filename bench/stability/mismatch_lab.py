"""Mismatch lab: the paper's stability findings in miniature, on CPU, with a tiny random Qwen3-MoE.

Toy task: a prompt of 4 random tokens, a response of 8 sampled tokens; reward = fraction of response tokens t with
t % 4 == prompt[0] % 4 (chance 0.25). G responses per prompt, group-mean advantages, MiniRL loss.

(a) IS correction. The rollout policy mu is the same model run in bfloat16 (weights and compute); training is
    float32. MiniRL with TIS vs MiniRL without any train-inference correction ("wo_train-infer-is"), on-policy (N=1).
    Logged per step: KL(mu || pi_old) (k1, k3), entropy, reward.
(b) Routing Replay. mu = float32 model with a perturbed router (noise on the router weights, a stand-in for an FP8 /
    different-kernel inference router). For no replay, R2 and R3 at N = 1, 2, 4 mini-batch updates per rollout
    batch: router agreement between the experts the update forward used and the rollout's, and the mismatch KL
    KL(mu || pi_theta) (k3) seen by each update.

Run: python bench/stability/mismatch_lab.py [--steps 40] ; writes bench/results/stability/{*.png, results.json}.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

from agentrl.objective import compute_advantages, policy_loss, token_entropy  # noqa: E402
from agentrl.routing_replay import RoutingReplay, router_agreement  # noqa: E402

VOCAB, PROMPT_LEN, RESPONSE_LEN = 64, 4, 8
OUT = Path(__file__).resolve().parents[1] / "results" / "stability"


def tiny_moe(seed: int) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=64, decoder_sparse_step=1, mlp_only_layers=[],
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(std=1.0)
            elif ".mlp.experts." in name:
                p.normal_(std=0.2)
    return model


@torch.no_grad()
def sample(mu: torch.nn.Module, prompts: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Sample RESPONSE_LEN tokens from mu at temperature 1 (full forward per step: sequences are tiny)."""
    seq = prompts
    for _ in range(RESPONSE_LEN):
        logits = mu(seq).logits[:, -1].float()  # [B, V]
        nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)  # [B, 1]
        seq = torch.cat([seq, nxt], dim=1)
    return seq  # [B, P + R]


def response_logp(model: torch.nn.Module, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of the response tokens `[B, R]` and their logits `[B, R, V]` (float32)."""
    logits = model(seq).logits[:, PROMPT_LEN - 1 : -1].float()  # [B, R, V]
    logp = torch.log_softmax(logits, -1).gather(-1, seq[:, PROMPT_LEN:, None]).squeeze(-1)  # [B, R]
    return logp, logits


def reward(seq: torch.Tensor) -> torch.Tensor:
    target = seq[:, :1] % 4  # [B, 1]
    return (seq[:, PROMPT_LEN:] % 4 == target).float().mean(dim=1)  # [B]


def make_batch(n_prompts: int, group: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    prompts = torch.randint(0, VOCAB, (n_prompts, PROMPT_LEN), generator=gen)
    return prompts.repeat_interleave(group, 0), torch.arange(n_prompts).repeat_interleave(group)


def bf16_copy(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model).to(torch.bfloat16).eval()


def perturbed_router_copy(model: torch.nn.Module, std: float, gen: torch.Generator) -> torch.nn.Module:
    mu = copy.deepcopy(model).eval()
    with torch.no_grad():
        for name, p in mu.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.add_(torch.randn(p.shape, generator=gen) * std)
    return mu


# -- (a) IS correction ----------------------------------------------------------------------------------------------


def run_is_experiment(correction: str, steps: int, lr: float, seed: int) -> list[dict[str, float]]:
    model = tiny_moe(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    history = []
    for step in range(steps):
        mu = bf16_copy(model)  # the inference engine: bf16 weights and compute, synced every step
        prompts, groups = make_batch(8, 8, gen)
        seq = sample(mu, prompts, gen)
        with torch.no_grad():
            rollout_logp, _ = response_logp(mu, seq)
            old_logp, _ = response_logp(model.eval(), seq)
        rewards = reward(seq)
        adv = compute_advantages("group_mean", rewards, groups)
        model.train()
        logp, logits = response_logp(model, seq)
        mask = torch.ones_like(logp, dtype=torch.bool)
        loss, metrics = policy_loss("minirl", logp, old_logp, rollout_logp, adv, mask, correction=correction)
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics.update(step=step, reward=float(rewards.mean()), entropy=float(token_entropy(logits.detach()).mean()))
        history.append(metrics)
    return history


# -- (b) Routing Replay -------------------------------------------------------------------------------------------


def run_replay_experiment(mode: str, n_minibatches: int, rollouts: int, lr: float, seed: int,
                          router_noise: float) -> dict[str, float]:  # fmt: skip
    model = tiny_moe(seed)
    rr = RoutingReplay(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    agreements, kls, first_kls, stale = [], [], [], []
    for _ in range(rollouts):
        mu = perturbed_router_copy(model, router_noise, gen)
        prompts, groups = make_batch(8, 8, gen)
        seq = sample(mu, prompts, gen)
        with torch.no_grad(), RoutingReplay(mu).record() as rollout_rec:
            rollout_logp, _ = response_logp(mu, seq)
        rollout_routes = rollout_rec.routes  # [B, S, L, K], carried with the sample (R3)
        model.eval()
        with torch.no_grad():
            if mode == "R3":
                with rr.replay(rollout_routes):
                    old_logp, _ = response_logp(model, seq)
                train_routes = rollout_routes
            else:
                with rr.record() as old_rec:
                    old_logp, _ = response_logp(model, seq)
                train_routes = old_rec.routes if mode == "R2" else None
        adv = compute_advantages("group_mean", reward(seq), groups)
        model.train()
        size = seq.shape[0] // n_minibatches
        for k in range(n_minibatches):
            rows = slice(k * size, (k + 1) * size)
            with rr.replay(train_routes[rows]) if train_routes is not None else rr.record() as used:
                logp, _ = response_logp(model, seq[rows])
                mask = torch.ones_like(logp, dtype=torch.bool)
                loss, _ = policy_loss("minirl", logp, old_logp[rows], rollout_logp[rows], adv[rows], mask)
                opt.zero_grad()
                loss.backward()
            routes_used = train_routes[rows] if train_routes is not None else used.routes
            agreements.append(router_agreement(routes_used[:, :-1], rollout_routes[rows, :-1]))
            log_ratio = (logp.detach() - rollout_logp[rows]).double()  # log pi_theta / mu
            kl = float((log_ratio.exp() - 1 - log_ratio).mean())  # k3 of KL(mu || pi_theta)
            kls.append(kl)
            if k == 0:
                first_kls.append(kl)
            stale.append(float((old_logp[rows] - logp.detach()).mean()))
            opt.step()
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"router_agreement": mean(agreements), "mismatch_kl_k3": mean(kls), "first_minibatch_kl_k3": mean(first_kls),
            "staleness_kl_k1": mean(stale)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps for (a)")
    parser.add_argument("--rollouts", type=int, default=6, help="rollout batches per configuration for (b)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--router-noise", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    is_runs = {c: run_is_experiment(c, args.steps, args.lr, args.seed) for c in tqdm(["tis", "none"], desc="(a) IS")}
    configs = [(m, n) for n in (1, 2, 4) for m in ("none", "R2", "R3")]
    replay = {f"{m}/N={n}": run_replay_experiment(m, n, args.rollouts, args.lr, args.seed, args.router_noise)
              for m, n in tqdm(configs, desc="(b) replay")}  # fmt: skip
    elapsed = time.time() - t0

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for c, hist in is_runs.items():
        label = "MiniRL + TIS" if c == "tis" else "MiniRL, no IS (wo_train-infer-is)"
        for ax, key in zip(axes, ("kl_k3", "entropy", "reward"), strict=True):
            ax.plot([h["step"] for h in hist], [h[key] for h in hist], label=label)
            ax.set_title({"kl_k3": "KL(mu||pi_old), k3", "entropy": "entropy (nats)", "reward": "reward"}[key])
            ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.suptitle("(a) bf16 inference vs fp32 training, tiny Qwen3-MoE, on-policy")
    fig.tight_layout()
    fig.savefig(OUT / "is_correction.png", dpi=110)

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.25
    for j, mode in enumerate(("none", "R2", "R3")):
        xs = [i + (j - 1) * width for i in range(3)]
        axes[0].bar(xs, [replay[f"{mode}/N={n}"]["router_agreement"] for n in (1, 2, 4)], width, label=mode)
        axes[1].bar(xs, [replay[f"{mode}/N={n}"]["mismatch_kl_k3"] for n in (1, 2, 4)], width, label=mode)
    for ax, title in zip(axes, ("router agreement (update vs rollout)", "KL(mu||pi_theta) k3 per update"),
                         strict=True):  # fmt: skip
        ax.set_xticks(range(3), ["N=1", "N=2", "N=4"])
        ax.set_title(title)
    axes[0].set_ylim(0.5, 1.01)
    axes[0].legend()
    fig.suptitle(f"(b) perturbed inference router (noise std {args.router_noise}), tiny Qwen3-MoE")
    fig.tight_layout()
    fig.savefig(OUT / "routing_replay.png", dpi=110)

    (OUT / "results.json").write_text(json.dumps({"args": vars(args), "seconds": elapsed, "is": is_runs,
                                                  "replay": replay}, indent=1))  # fmt: skip
    print(f"finished in {elapsed:.0f} s; plots in {OUT}")
    print("\n(a) IS correction: mean over the last 10 steps")
    print(f"{'run':<8}{'kl_k1':>12}{'kl_k3':>12}{'entropy':>10}{'reward':>9}{'trunc_frac':>12}")
    for c, hist in is_runs.items():
        last = hist[-10:]
        avg = {k: sum(h[k] for h in last) / len(last) for k in ("kl_k1", "kl_k3", "entropy", "reward",
                                                                 "correction_truncated_frac")}  # fmt: skip
        print(f"{c:<8}{avg['kl_k1']:>12.2e}{avg['kl_k3']:>12.2e}{avg['entropy']:>10.3f}{avg['reward']:>9.3f}"
              f"{avg['correction_truncated_frac']:>12.4f}")  # fmt: skip
    print("\n(b) Routing Replay (ratios vs no replay at the same N)")
    print(f"{'config':<10}{'agreement':>10}{'KL k3':>11}{'xKL/none':>10}{'1st-mb KL':>11}{'staleness':>11}")
    for key, r in replay.items():
        base = replay[f"none/N={key.split('=')[1]}"]["mismatch_kl_k3"]
        print(f"{key:<10}{r['router_agreement']:>10.3f}{r['mismatch_kl_k3']:>11.2e}{r['mismatch_kl_k3'] / base:>10.2f}"
              f"{r['first_minibatch_kl_k3']:>11.2e}{r['staleness_kl_k1']:>11.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
