"""SARA's allocation inside TRL's GRPOTrainer, on a tiny local GPT-2 on CPU (a few steps).

    pip install trl            # 1.16 checked
    python examples/trl_grpo.py --steps 2
"""

from __future__ import annotations

import argparse
import tempfile


def contains_answer(prompts, completions, answer, **_):
    """A TRL-style reward function: 1 where the completion holds the expected answer."""
    return [float(a is not None and a in c) for c, a in zip(completions, answer)]


def even_length(prompts, completions, **_):
    """A toy reward an untrained tiny model earns about half the time, so groups are mixed
    (contains_answer is what a real run would use; an untrained model never earns it)."""
    return [float(len(c) % 2 == 0) for c in completions]


def main(steps: int = 2, out_dir: str | None = None) -> list[dict]:
    """Train `steps` GRPO steps on SARA's effective groups; returns TRL's log history."""
    from trl import GRPOConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sara_client import local
    from sara_integrations.trl import SaraGRPOTrainer
    from sara_trainer.tiny import build_tiny_policy

    out = out_dir or tempfile.mkdtemp(prefix="sara-trl-")
    model_dir = build_tiny_policy(f"{out}/tiny")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    prompts = [{"id": f"q{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(40)]
    args = GRPOConfig(output_dir=f"{out}/trl", max_steps=steps, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=4, learning_rate=1e-4, beta=0.0,
                      logging_steps=1, report_to="none", use_cpu=True, save_strategy="no")
    # SARA delivers only mixed groups (non-zero advantage); TRL's batch is one group of 4
    with local(f"{out}/sara", group_size=4, batch_size=1, policy="sara", tau_low=0.3) as sara:
        sara.add_prompts(prompts)
        trainer = SaraGRPOTrainer(sara, model=AutoModelForCausalLM.from_pretrained(model_dir),
                                  processing_class=tokenizer, reward_funcs=[even_length],
                                  args=args, train_dataset=SaraGRPOTrainer.step_dataset(steps * 4))
        trainer.train()
        stats = sara.stats()
        print(f"{stats.counters.batches_acked} batches acked, "
              f"{stats.counters.groups_abandoned} groups abandoned early")
    return trainer.state.log_history


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2)
    main(parser.parse_args().steps)
