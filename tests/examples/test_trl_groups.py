"""Groups of unequal size through TRL's real GRPOTrainer: SARA with commit=partial delivers
groups of 2 to 4 rollouts, the adapter pads each to num_generations = 4 with rows of reward None
whose one token is masked out (env_mask), and TRL's own (NaN-aware) group statistics must give every
real rollout the advantage a naive per-group computation gives it, and every padding row 0.
Skipped where TRL is not installed."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")
pytest.importorskip("sara_service")


def naive_advantage(rewards):
    """TRL's group normalisation written out for one group: (r - mean) / (std + 1e-4), the std
    with Bessel's correction."""
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
    return [(r - mean) / (std + 1e-4) for r in rewards]


def test_trl_normalises_each_group_over_its_own_rollouts(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from sara_client import local
    from sara_integrations.trl import SaraGRPOTrainer
    from sara_trainer.tiny import build_tiny_policy

    model_dir = build_tiny_policy(str(tmp_path / "tiny"))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    seen: dict[str, list] = {"advantages": [], "expected": [], "sizes": []}

    class Recording(SaraGRPOTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            seen["advantages"] += inputs["advantages"].reshape(-1).tolist()
            return super().compute_loss(model, inputs, *args, **kwargs)

    def even_length(prompts, completions, **_):
        return [float(len(c) % 2 == 0) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=3, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=4, learning_rate=1e-4, beta=0.0,
                      logging_steps=1, report_to="none", use_cpu=True, save_strategy="no")
    prompts = [{"id": f"q{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(40)]
    with local(str(tmp_path / "sara"), group_size=4, batch_size=2, policy="sara", tau_low=0.3,
               commit="partial") as sara:
        sara.add_prompts(prompts)
        trainer = Recording(sara, model=AutoModelForCausalLM.from_pretrained(model_dir),
                            processing_class=tokenizer, reward_funcs=[even_length], args=args,
                            train_dataset=Recording.step_dataset(3 * 8))
        rollout_func = trainer.rollout_func

        def recording_rollouts(prompts, trl_trainer):
            out = rollout_func(prompts, trl_trainer)
            rewards = out["sara_reward"]
            for start in range(0, len(rewards), 4):
                real = [r for r in rewards[start:start + 4] if r is not None]
                seen["sizes"].append(len(real))
                seen["expected"] += naive_advantage(real) + [0.0] * (4 - len(real))
            padded = [(ids, mask) for ids, mask, r in zip(out["completion_ids"], out["env_mask"],
                                                          rewards) if r is None]
            assert padded and all(len(ids) == 1 and mask == [0] for ids, mask in padded)
            return out

        trainer.rollout_func = recording_rollouts
        trainer.train()
    assert min(seen["sizes"]) < 4, seen["sizes"]      # some groups were padded
    # TRL shuffles rows into micro-batches: compare the advantages as multisets
    assert sorted(seen["advantages"]) == pytest.approx(sorted(seen["expected"]), abs=1e-5)
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 3 and all(math.isfinite(h["loss"]) for h in steps)


def test_groups_larger_than_num_generations_and_row_normalised_losses_are_refused():
    from sara_integrations.trl import batch_rows, check_padding_is_exact

    group = SimpleNamespace(group_id="g1", prompt="p", rollouts=["a", "b", "c"])
    assert batch_rows(SimpleNamespace(groups=[group]), 4) == [("p", "a"), ("p", "b"),
                                                              ("p", "c"), ("p", None)]
    with pytest.raises(ValueError, match="more than num_generations=2.*SARA_VK_MAX"):
        batch_rows(SimpleNamespace(groups=[group]), 2)
    check_padding_is_exact(SimpleNamespace(loss_type="dapo"))
    with pytest.raises(ValueError, match="normalised by tokens.*loss_type='grpo'"):
        check_padding_is_exact(SimpleNamespace(loss_type="grpo"))
