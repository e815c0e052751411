"""Policy helpers: seeded sampling, logprobs that training reproduces, greedy accuracy, spread."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sara_demo.evaluate import greedy_accuracy, group_outcomes
from sara_demo.tasks.arith import BUCKET_NAMES, make_eval_set
from sara_trainer.policy import completion_logprobs, encode_prompts, make_batch, sample


def test_sampling_is_seeded_and_logprobs_match_a_training_forward(tiny):
    model, tokenizer = tiny
    prompts = ["12+345=", "7*8=", "999-1="]
    a = sample(model, tokenizer, prompts, k=4, max_new_tokens=6, temperature=1.0,
               generator=torch.Generator().manual_seed(0))
    b = sample(model, tokenizer, prompts, k=4, max_new_tokens=6, temperature=1.0,
               generator=torch.Generator().manual_seed(0))
    assert a.token_ids == b.token_ids and a.completions == b.completions
    assert len(a) == 12 and len(a.group(2)) == 4
    for ids, lps, reason in zip(a.token_ids, a.logprobs, a.finish_reasons):
        assert len(ids) == len(lps) and 1 <= len(ids) <= 6
        assert reason == ("stop" if ids[-1] == tokenizer.eos_token_id else "length")
        assert all(lp <= 0 for lp in lps)
    rows = [a.prompt_ids[i // 4] for i in range(12)]
    batch = make_batch(rows, a.token_ids, tokenizer.pad_token_id)
    with torch.no_grad():
        logp, entropy = completion_logprobs(model, batch, with_entropy=True)
    for r, lps in enumerate(a.logprobs):
        torch.testing.assert_close(logp[r, :len(lps)], torch.tensor(lps), atol=1e-5, rtol=0)
    assert torch.all(logp[batch.completion_mask == 0] == 0)
    assert torch.all(entropy >= 0)


def test_greedy_does_not_depend_on_batching(tiny):
    model, tokenizer = tiny
    prompts = ["1+1=", "1234+5678=", "99*9="]
    together = sample(model, tokenizer, prompts, k=1, max_new_tokens=5, temperature=0)
    for i, p in enumerate(prompts):
        alone = sample(model, tokenizer, [p], k=1, max_new_tokens=5, temperature=0)
        assert alone.token_ids[0] == together.token_ids[i]
    assert encode_prompts(tokenizer, [{"prompt": "1+1="}]) == encode_prompts(tokenizer, ["1+1="])


def test_greedy_accuracy_and_group_outcomes_report_by_bucket(tiny):
    model, tokenizer = tiny
    evals = make_eval_set(60, seed=0)
    acc = greedy_accuracy(model, tokenizer, evals)
    assert acc["n"] == 60 and 0.0 <= acc["accuracy"] <= 1.0
    assert list(acc["by_bucket"]) == list(BUCKET_NAMES)
    spread = group_outcomes(model, tokenizer, evals[:20], k=3,
                            generator=torch.Generator().manual_seed(0))
    assert abs(spread["all_fail"] + spread["mixed"] + spread["all_success"] - 1.0) < 1e-9
    assert spread["n"] == 20


def test_a_loaded_policy_runs_the_fused_gelu_with_the_same_outputs_and_config(tiny_dir,
                                                                             tmp_path):
    import torch
    from sara_client.hf_kernels import UNFUSED_GELU, fuse_gelu
    from sara_trainer.policy import load_policy
    from transformers import AutoModelForCausalLM

    fused, _ = load_policy(tiny_dir)
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    kinds = {type(m).__name__ for m in fused.modules()}
    assert UNFUSED_GELU in {type(m).__name__ for m in plain.modules()}
    assert UNFUSED_GELU not in kinds and "GELU" in kinds
    ids = torch.randint(4, 60, (8, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(fused(ids).logits, plain(ids).logits, atol=1e-5)
    # a kernel choice, not a model change: a saved checkpoint is the model it was loaded from
    fused.save_pretrained(tmp_path)
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.activation_function == \
        plain.config.activation_function == "gelu_new"
    assert fuse_gelu(fused) == 0                          # nothing left to swap
    assert fuse_gelu(torch.nn.Sequential(torch.nn.ReLU())) == 0
