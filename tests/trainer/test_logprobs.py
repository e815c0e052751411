"""Chunked log-probabilities equal the naive full-vocabulary computation, values and gradients."""

from tests._need import need

need("torch", "torch (the trainer extra; CI installs it)")

import pytest
import torch

from sara_trainer.logprobs import chunked_completion_logprobs
from sara_trainer.policy import completion_logprobs, make_batch


def _qwen2_tiny():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=False)
    return Qwen2ForCausalLM(config).float().eval()


def _batch(vocab: int):
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (3, 5, 1, 4)]
    completions = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (6, 2, 0, 7)]
    return make_batch(prompts, completions, pad_id=0)


def _compare(model, vocab: int, temperature: float, chunk_rows: int) -> None:
    batch = _batch(vocab)
    naive, naive_ent = completion_logprobs(model, batch, temperature, with_entropy=True)
    weights = torch.linspace(-1.0, 1.0, naive.numel()).view_as(naive)
    (naive * weights).sum().backward()
    naive_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    chunked, ent = chunked_completion_logprobs(model, batch, temperature, with_entropy=True,
                                               chunk_rows=chunk_rows)
    (chunked * weights).sum().backward()
    torch.testing.assert_close(chunked, naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, naive_ent, rtol=1e-5, atol=1e-5)
    for got, want in zip((p.grad for p in model.parameters()), naive_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("chunk_rows", [1, 5, 4096])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_qwen2_chunked_equals_naive(chunk_rows, temperature):
    _compare(_qwen2_tiny(), 97, temperature, chunk_rows)


def test_tied_gpt2_chunked_equals_naive(tiny):
    model, tokenizer = tiny
    _compare(model.float(), len(tokenizer), 1.0, 3)


def test_no_grad_path_matches():
    model = _qwen2_tiny()
    batch = _batch(97)
    with torch.no_grad():
        naive, _ = completion_logprobs(model, batch)
        chunked, entropy = chunked_completion_logprobs(model, batch, chunk_rows=2)
    assert entropy is None
    torch.testing.assert_close(chunked, naive, rtol=1e-5, atol=1e-5)
