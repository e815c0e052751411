"""A plain transformers GRPO loop with SARA running inside the same process.

    python examples/embedded_grpo_loop.py --steps 5

No server, no worker processes: ``sara_client.local()`` starts the real scheduler (the same
FastAPI app and Lua scripts as ``sara serve``) on an embedded Redis and hands back an ordinary
``SaraClient``. The loop plays both roles the service normally splits between processes:

    worker side   lease -> model.generate (batched over the lease) -> verify -> report
    trainer side  next_batch -> group-normalised advantages -> token-level PG loss -> step
                  -> ack -> publish_policy(version + 1)

SARA decides, while each group of k rollouts is being sampled, whether the group will end up mixed
(some rewards 1, some 0). A new group first gets a few probe rollouts; the first mixed result
commits it (the rest of its k are issued), an all-fail or all-success prefix that makes a mixed
group unlikely abandons it, and its budget goes to a fresh prompt. ``next_batch`` therefore only
ever hands the trainer effective groups: their k rewards are never all the same.

The policy is the repository's tiny character-level GPT-2 (``sara_trainer.tiny``), built fresh
unless ``--model`` names a Hugging Face causal LM directory. Freshly initialised it almost never
answers, so nearly every group is abandoned and a batch costs ~100 rollouts per effective group;
a couple of seconds of supervised warm start (``--sft-steps``, ``sara_demo.sft``) on one-digit
additions lifts its success rate there to ~10%, enough for a third to a half of those groups to
be mixed. The two-digit additions (half the prompts by default) stay out of reach: Dynamic
Sampling would pay k rollouts for each of them, SARA abandons them after its probes (``saved vs
DS`` in the step lines). ``--policy dynamic_sampling`` runs the same loop under DS to compare.

Each step prints the rollouts spent, groups committed and abandoned, and effective groups
delivered; the last line is ``SUMMARY {json}`` (also written to ``--out``/summary.json) for tools.

Pieces taken from ``sara_trainer`` and ``sara_demo`` when they are importable, with a small inline
stand-in otherwise: the arith prompts, the SFT warm start (skipped without it), GRPO advantages
and the clipped policy-gradient loss. Rewards come from the worker's verifier registry
(``sara_worker.verifiers``), the same function a ``sara worker`` would score with.

It is past 400 lines because it is an example meant to be read and copied as one file: the
stand-ins that let it run without the trainer and demo packages are part of what it shows.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import sara_client
import torch
from sara_client import BatchGroup, Rollout, RolloutResult

WORKER_ID = "embedded"


# ---------------------------------------------------------------------------------------------
# prompts and rewards


def make_prompts(n: int, seed: int, easy_fraction: float = 0.5) -> list[dict[str, Any]]:
    """`n` arith prompts in the service's PromptIn shape: `easy_fraction` of them one-digit
    additions (learnable within the time budget; there are only ~90, so at most that many), the
    rest two-digit additions (beyond the tiny model: SARA abandons them).

    Uses ``sara_demo.tasks.arith`` when it is importable; otherwise builds the same shape
    inline (completion = the result's digits reversed, ``meta.reversed_answer``).
    """
    easy = min(n, max(1, round(n * easy_fraction)))
    try:
        from sara_demo.tasks.arith import make_split, split_size
    except ImportError:
        easy = min(easy, 100)
        return _inline_prompts(easy, n - easy, seed)
    easy = min(easy, split_size("add1", "train"))
    return (make_split(easy, seed, buckets=["add1"])
            + (make_split(n - easy, seed, buckets=["add2"]) if n > easy else []))


def _inline_prompts(easy: int, hard: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    chosen = [(a, b, "add1") for a, b in pairs[:easy]]
    seen: set[tuple[int, int]] = set()
    while len(seen) < hard:
        seen.add((rng.randint(10, 99), rng.randint(10, 99)))
    chosen += [(a, b, "add2") for a, b in sorted(seen)]
    return [{"id": f"arith-{bucket}-{a}-{b}", "prompt": f"{a}+{b}=", "answer": str(a + b),
             "task": "arith", "meta": {"bucket": bucket, "reversed_answer": True}}
            for a, b, bucket in chosen]


def reward_fn():
    """(rollout, completion) -> reward: the worker's verifier registry, or an inline arith check."""
    try:
        from sara_worker import verifiers
    except ImportError:
        verifiers = None

    def reward(rollout: Rollout, completion: str) -> float:
        if verifiers is not None:
            return verifiers.score(rollout.task, completion, rollout.answer, rollout.meta)
        digits = "".join(ch for ch in completion if ch.isdigit())
        if rollout.meta.get("reversed_answer"):
            digits = digits[::-1]
        return float(bool(digits) and digits == (rollout.answer or "").strip())

    return reward


# ---------------------------------------------------------------------------------------------
# model


def load_model(path: str | None, workdir: Path, seed: int):
    """(model, tokenizer): `path` if given, else a freshly built tiny char-level GPT-2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path is None:
        try:
            from sara_trainer.tiny import TinyConfig, build_tiny_policy
        except ImportError:
            sys.exit("no --model given and sara_trainer is not installed to build the tiny one")
        path = str(build_tiny_policy(workdir / "tiny", TinyConfig(seed=seed)))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"  # batched generation continues every prompt from its end
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # eager attention: for these tiny sequences SDPA is several times slower on CPU
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="eager")
    for module in model.modules():  # RL wants logp_new == logp_old before the first update
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.eval()
    return model, tokenizer


def warm_start(model, tokenizer, steps: int, seed: int) -> dict[str, Any] | None:
    """A few SFT steps on one-digit additions (``sara_demo.sft``); None when skipped."""
    if steps <= 0:
        return None
    try:
        from sara_demo.sft import sft
    except ImportError:
        print("sara_demo.sft is not importable: no warm start", flush=True)
        return None
    started = time.perf_counter()
    result = sft(model, tokenizer, max_steps=steps, batch_size=128, lr=3e-3, schedule="constant",
                 warmup_steps=3, seed=seed, buckets=["add1"], progress=False)
    model.eval()
    return {"steps": result.steps, "final_loss": result.final_loss,
            "seconds": round(time.perf_counter() - started, 2)}


def context_size(model) -> int:
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 30


@torch.no_grad()
def generate(model, tokenizer, rollouts: list[Rollout]) -> list[dict[str, Any]]:
    """One batched ``model.generate`` over a lease, with the lease's sampling parameters (the
    scheduler's, the same for every rollout). Returns, per rollout: completion text, the sampled
    token ids (through the eos, if any), their log-probabilities and the finish reason.

    The logprobs are raw: log-softmax of the model's logits before temperature and top-p, the
    convention of SARA's worker backends (and vLLM's default), so batches mix cleanly whichever
    worker produced them; the update below recomputes logprobs the same way."""
    sampling = rollouts[0].sampling
    enc = tokenizer([r.prompt for r in rollouts], return_tensors="pt", padding=True)
    width = enc["input_ids"].shape[1]
    max_new = max(1, min(sampling.max_tokens, context_size(model) - width))
    greedy = sampling.temperature == 0
    options = {"do_sample": False} if greedy else {
        "do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
        "top_k": 0}  # top_k=0: no top-k truncation (generate's default would be 50)
    out = model.generate(**enc, max_new_tokens=max_new, output_logits=True,
                         return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, **options)
    tokens = out.sequences[:, width:]
    # out.logits: the raw logits at each new position (before temperature / top-p)
    logp = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)
    logp = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    eos = tokenizer.eos_token_id
    results = []
    for row, lps in zip(tokens.tolist(), logp.tolist()):
        stop = eos in row
        end = row.index(eos) + 1 if stop else len(row)
        ids = row[:end]
        body = ids[:-1] if stop else ids
        results.append({"completion": tokenizer.decode(body, skip_special_tokens=True),
                        "token_ids": ids, "logprobs": lps[:end],
                        "finish_reason": "stop" if stop else "length"})
    return results


# ---------------------------------------------------------------------------------------------
# the update: GRPO advantages, token-level clipped policy gradient


def _inline_grpo(groups: list[list[float]], eps: float = 1e-6) -> list[float]:
    """(r - group mean) / (group std + eps), Bessel-corrected; 0 for a zero-variance group."""
    out = []
    for rewards in groups:
        mean = sum(rewards) / len(rewards)
        var = sum((r - mean) ** 2 for r in rewards) / max(len(rewards) - 1, 1)
        std = math.sqrt(var)
        out += [(r - mean) / (std + eps) if std > 0 else 0.0 for r in rewards]
    return out


def _inline_policy_loss(logp, adv, mask, old_logp, clip_low: float = 0.2, clip_high: float = 0.28):
    """Clipped PG loss averaged over every completion token of the batch (DAPO's token-mean)."""
    ratio = torch.exp((logp - old_logp).clamp(-20, 20))
    adv = adv.unsqueeze(-1)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip_low, 1 + clip_high))
    loss = (pg * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"loss": float(loss.detach())}


def grpo_parts() -> tuple[Any, Any, dict[str, str]]:
    """(advantages(groups) -> list, loss(logp, adv, mask, old) -> (loss, metrics), which-impl)."""
    impl = {}
    try:
        from sara_trainer.advantages import compute_advantages

        def advantages(groups):
            return [float(a) for a in compute_advantages(groups, "grpo")]
        impl["advantages"] = "sara_trainer"
    except ImportError:
        advantages = _inline_grpo
        impl["advantages"] = "inline"
    try:
        from sara_trainer.loss import policy_loss

        def loss_fn(logp, adv, mask, old_logp):
            return policy_loss(logp, adv, mask, old_logp, aggregation="token-mean")
        impl["loss"] = "sara_trainer"
    except ImportError:
        loss_fn = _inline_policy_loss
        impl["loss"] = "inline"
    return advantages, loss_fn, impl


def token_batch(tokenizer, groups: list[BatchGroup]):
    """Rows of prompt (left-padded to width P) + sampled completion tokens (right-padded).

    Position ids count real tokens only, as ``generate`` numbered them, so the log-probabilities
    recomputed here are the ones the rollouts were sampled with (before the update).
    """
    prompts, completions, old = [], [], []
    for group in groups:
        prompt_ids = tokenizer(group.prompt)["input_ids"]
        for r in group.rollouts:
            ids = r.token_ids
            if ids is None:  # a worker that did not send tokens: re-encode the text
                ids = tokenizer(r.completion)["input_ids"] + [tokenizer.eos_token_id]
            lps = r.logprobs if r.logprobs is not None and len(r.logprobs) == len(ids) else None
            prompts.append(prompt_ids)
            completions.append(ids)
            old.append(lps)
    rows, width = len(prompts), max(len(p) for p in prompts)
    tc = max(1, max(len(c) for c in completions))
    input_ids = torch.full((rows, width + tc), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((rows, width + tc), dtype=torch.long)
    mask = torch.zeros((rows, tc))
    old_logp = torch.zeros((rows, tc))
    has_old = torch.zeros(rows, dtype=torch.bool)
    for i, (p, c, lp) in enumerate(zip(prompts, completions, old)):
        input_ids[i, width - len(p):width] = torch.tensor(p)
        input_ids[i, width:width + len(c)] = torch.tensor(c, dtype=torch.long)
        attention[i, width - len(p):width + len(c)] = 1
        mask[i, :len(c)] = 1.0
        if lp is not None:
            old_logp[i, :len(c)] = torch.tensor(lp)
            has_old[i] = True
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention, positions, width, mask, old_logp, has_old


def completion_logprobs(model, input_ids, attention, positions, width):
    """Raw log p(token | prefix) of every completion column, [B, Tc] (with the gradient)."""
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                   use_cache=False).logits
    tc = input_ids.shape[1] - width
    logp = torch.log_softmax(logits[:, width - 1:width - 1 + tc].float(), dim=-1)
    return logp.gather(-1, input_ids[:, width:].unsqueeze(-1)).squeeze(-1)


def grpo_update(model, tokenizer, optimizer, groups: list[BatchGroup], advantages, loss_fn,
                grad_clip: float = 1.0) -> dict[str, Any]:
    """One optimiser step on a batch of effective groups."""
    rewards = [[r.reward for r in g.rollouts] for g in groups]
    adv = torch.tensor(advantages(rewards), dtype=torch.float32)
    input_ids, attention, positions, width, mask, old_logp, has_old = token_batch(tokenizer,
                                                                                  groups)
    model.train()
    logp = completion_logprobs(model, input_ids, attention, positions, width)
    # rollouts without behaviour logprobs are treated as on-policy (ratio 1)
    old_logp = torch.where(has_old.unsqueeze(-1), old_logp, logp.detach())
    loss, metrics = loss_fn(logp, adv, mask, old_logp)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    model.eval()
    return {"loss": float(loss.detach()), "grad_norm": float(grad_norm),
            "tokens": int(mask.sum()), "ratio_mean": metrics.get("ratio_mean")}  # None inline


# ---------------------------------------------------------------------------------------------
# the loop


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=5, help="optimiser steps (one batch each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None,
                   help="a Hugging Face causal LM directory; default: build the tiny char GPT-2")
    p.add_argument("--out", default=None,
                   help="write the final policy and summary.json here")
    p.add_argument("--sft-steps", type=int, default=None,
                   help="supervised warm-start steps on one-digit additions before RL "
                        "(unset: 30 for the freshly built tiny model, 0 with --model)")
    p.add_argument("--prompts", type=int, default=64, help="arith prompts to register")
    p.add_argument("--easy-fraction", type=float, default=0.5,
                   help="share of one-digit additions among the prompts (the rest: two-digit)")
    p.add_argument("--group-size", type=int, default=8, help="k, rollouts per group")
    p.add_argument("--batch-size", type=int, default=8, help="effective groups per batch")
    p.add_argument("--tau-low", type=float, default=0.5, help="SARA's abandonment threshold")
    p.add_argument("--policy", default="sara", choices=("sara", "dynamic_sampling", "uniform"),
                   help="the scheduler's allocation policy: run dynamic_sampling to compare")
    p.add_argument("--prior", default="uniform", choices=("uniform", "history"),
                   help="SARA's prior per group: uniform (the paper's SARA) or each prompt's "
                        "persisted, decayed posterior")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=6)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lease-size", type=int, default=256, help="max rollouts per lease")
    p.add_argument("--max-rollouts-per-batch", type=int, default=2048,
                   help="the scheduler closes a batch early with what it has after this many")
    p.add_argument("--max-rounds", type=int, default=200,
                   help="lease/report rounds per step before giving up on a batch")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest for the tiny model on a busy box)")
    return p.parse_args(argv)


def collect_batch(sara, model, tokenizer, reward, version: int, args, cancelled: set[str],
                  decided: dict[str, str]):
    """Play the worker until the scheduler has an effective batch: (batch or None, rounds)."""
    for rounds in range(1, args.max_rounds + 1):
        # --- worker side: lease, generate, verify, report ---------------------------------------
        lease = sara.lease(WORKER_ID, max_rollouts=args.lease_size)
        cancelled.update(lease.cancel)
        todo = [r for r in lease.rollouts if r.rollout_id not in cancelled]
        # a rollout cancelled before it ran is answered as an abort with nothing generated
        results = [RolloutResult(rollout_id=r.rollout_id, reward=0.0, finish_reason="abort",
                                 policy_version=version)
                   for r in lease.rollouts if r.rollout_id in cancelled]
        if todo:
            for r, gen in zip(todo, generate(model, tokenizer, todo)):
                results.append(RolloutResult(
                    rollout_id=r.rollout_id, reward=reward(r, gen["completion"]),
                    completion=gen["completion"], completion_tokens=len(gen["token_ids"]),
                    finish_reason=gen["finish_reason"], policy_version=version,
                    token_ids=gen["token_ids"], logprobs=gen["logprobs"]))
        if results:
            answer = sara.report(WORKER_ID, results)
            # commit / abandon / continue for each group these results touched
            decided.update({d.group_id: d.decision for d in answer.decisions})
            # rollouts to abort: a worker generating asynchronously would stop them now; this
            # one generates a lease at a time, so it skips them if they come up in a later lease
            cancelled.update(answer.cancel)
        # --- trainer side: an effective batch, once one is ready --------------------------------
        batch = sara.next_batch()
        if batch is not None:
            return batch, rounds
    return None, args.max_rounds


def step_record(step: int, batch, version: int, metrics: dict[str, Any], rounds: int,
                seconds: float) -> dict[str, Any]:
    st = batch.stats
    group_rewards = [[r.reward for r in g.rollouts] for g in batch.groups]
    n = sum(map(len, group_rewards))
    return {
        "step": step, "batch_id": batch.batch_id, "policy_version": version,
        "batch_policy_version": batch.policy_version, "rollouts_spent": st.rollouts_spent,
        "rollouts_cancelled": st.rollouts_cancelled, "groups_committed": st.groups_committed,
        "groups_abandoned": st.groups_abandoned, "groups_dropped": st.groups_dropped,
        "rollouts_not_spent_on_abandoned_groups": st.rollouts_not_spent_on_abandoned_groups,
        "ds_rollouts_per_effective_group": st.ds_rollouts_per_effective_group,
        "ended_early": st.ended_early,
        "groups_delivered": len(batch.groups),
        # effective: at least one success and one failure (reward >= 0.5 is a success)
        "groups_effective": sum(0 < sum(r >= 0.5 for r in rs) < len(rs) for rs in group_rewards),
        "all_effective": all(0 < sum(r >= 0.5 for r in rs) < len(rs) for rs in group_rewards),
        "group_rewards": group_rewards, "mean_reward": sum(map(sum, group_rewards)) / max(n, 1),
        "rounds": rounds, "seconds": round(seconds, 3), **metrics}


def print_step(r: dict[str, Any]) -> None:
    dropped = f" dropped {r['groups_dropped']:2d}" if r["groups_dropped"] else ""
    early = " (early)" if r["ended_early"] else ""
    print(f"step {r['step']}: v{r['policy_version'] - 1}->v{r['policy_version']}  "
          f"rollouts spent {r['rollouts_spent']:4d} "
          f"(not spent on abandoned groups {r['rollouts_not_spent_on_abandoned_groups']:3d})  "
          f"groups committed {r['groups_committed']:2d} abandoned {r['groups_abandoned']:3d}"
          f"{dropped}  groups delivered {r['groups_delivered']:2d}{early} "
          f"({r['groups_effective']} effective)  "
          f"reward {r['mean_reward']:.2f}  loss {r['loss']:+.4f}  {r['seconds']:.1f}s", flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the loop; returns the summary it prints as ``SUMMARY {json}``."""
    args = parse_args(argv)
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="sara-example-") as tmp:
        workdir = Path(tmp)
        model, tokenizer = load_model(args.model, workdir, args.seed)
        sft_steps = args.sft_steps if args.sft_steps is not None else (
            0 if args.model else 30)
        sft_info = warm_start(model, tokenizer, sft_steps, args.seed)
        if sft_info:
            print(f"warm start: {sft_info['steps']} SFT steps, loss {sft_info['final_loss']:.3f}, "
                  f"{sft_info['seconds']:.1f}s", flush=True)
        prompts = make_prompts(args.prompts, args.seed, args.easy_fraction)
        advantages, loss_fn, impl = grpo_parts()
        reward = reward_fn()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        setup_seconds = time.perf_counter() - started

        # redis_url=None: always an embedded Redis in workdir, even where SARA_REDIS_URL is set
        settings = {"redis_url": None, "policy": args.policy, "prior": args.prior,
                    "group_size": args.group_size,
                    "batch_size": args.batch_size, "tau_low": args.tau_low,
                    "temperature": args.temperature, "max_tokens": args.max_new_tokens,
                    "max_rollouts_per_batch": args.max_rollouts_per_batch, "seed": args.seed}
        steps: list[dict[str, Any]] = []
        cancelled: set[str] = set()
        decided: dict[str, str] = {}
        with sara_client.local(data_dir=workdir / "sara", **settings) as sara:
            sara.add_prompts(prompts)
            version = sara.get_policy().version
            for step in range(1, args.steps + 1):
                t0 = time.perf_counter()
                batch, rounds = collect_batch(sara, model, tokenizer, reward, version, args,
                                              cancelled, decided)
                if batch is None:
                    print(f"step {step}: no effective batch after {rounds} lease rounds; "
                          "stopping (can the model solve any of the prompts?)", flush=True)
                    break
                # --- trainer side: update, confirm the batch, publish the new policy -------------
                metrics = grpo_update(model, tokenizer, optimizer, batch.groups, advantages,
                                      loss_fn)
                sara.ack(batch.batch_id)
                # in-process the live model *is* the new policy; a service deployment would save
                # a checkpoint and publish its path for the workers to load
                version = sara.publish_policy(version + 1).version
                steps.append(step_record(step, batch, version, metrics, rounds,
                                         time.perf_counter() - t0))
                print_step(steps[-1])
            stats = sara.stats()

        counters, derived = stats.counters, stats.derived
        summary = {
            "policy": args.policy, "steps_requested": args.steps, "steps_trained": len(steps),
            "policy_version": version,
            "all_batches_effective": all(s["all_effective"] for s in steps),
            "losses_finite": all(math.isfinite(s["loss"]) for s in steps),
            "group_size": args.group_size, "batch_size": args.batch_size,
            "tau_low": args.tau_low, "sft": sft_info, "impl": impl,
            "decisions": dict(Counter(decided.values())),
            "totals": {
                "rollouts_completed": counters.rollouts_completed,
                "groups_opened": counters.groups_opened,
                "groups_committed": counters.groups_committed,
                "groups_abandoned": counters.groups_abandoned,
                "groups_dropped": (counters.groups_dropped_saturated
                                   + counters.groups_dropped_stale),
                "groups_delivered": counters.groups_delivered,
                "groups_effective_trained": sum(s["groups_effective"] for s in steps),
                "rollouts_not_spent_on_abandoned_groups":
                    counters.rollouts_not_spent_on_abandoned_groups,
                "rollouts_per_effective_group": derived.rollouts_per_effective_group,
                # estimates from audit sampling, each with its 95% interval
                "ds_rollouts_per_effective_group": derived.ds_rollouts_per_effective_group,
                "ds_rollouts_per_effective_group_95": [derived.ds_rollouts_per_effective_group_low,
                                                       derived.ds_rollouts_per_effective_group_high],
                "net_saving_vs_ds": derived.net_saving_vs_ds,
                "net_saving_vs_ds_95": [derived.net_saving_vs_ds_low,
                                        derived.net_saving_vs_ds_high],
                "useful_fraction": derived.useful_fraction,
            },
            "setup_seconds": round(setup_seconds, 2),
            "seconds": round(time.perf_counter() - started, 2),
            "steps": steps,
        }
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            model.save_pretrained(out / "policy")
            tokenizer.save_pretrained(out / "policy")
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
    effective = sum(s["groups_effective"] for s in steps)
    if effective:
        print(f"{args.policy}: {counters.rollouts_completed / effective:.1f} rollouts completed "
              f"per effective group trained on (compare: --policy dynamic_sampling)", flush=True)
    print("SUMMARY " + json.dumps(summary, separators=(",", ":")), flush=True)
    return summary


if __name__ == "__main__":
    summary = main()
    sys.exit(0 if summary["steps_trained"] == summary["steps_requested"] else 1)
