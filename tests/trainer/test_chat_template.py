"""Chat prompts render to the same token ids on the worker (hf and vllm backends) and in the
trainer: the trainer must score the completion after exactly the prompt tokens the
engine generated from. The tiny policy's tokenizer carries a chat template (sara_trainer.tiny)."""

from __future__ import annotations

import asyncio
import types

import pytest

from sara_client.chat import RenderedPrompts, prompt_key, render_prompt, render_text
from sara_client.models import BatchGroup, BatchRollout, Rollout, SamplingParams
from tests._need import need

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+2=?"}]


def _rollout(prompt) -> Rollout:
    return Rollout(rollout_id="g1:0", group_id="g1", prompt_id="p", prompt=prompt, task="exact",
                   sampling=SamplingParams(max_tokens=3, temperature=1.0, seed=1))


def _trainer_prompt_ids(tiny, prompt) -> list[int]:
    """What Updater.rows feeds the policy as the prompt of a group carrying `prompt`."""
    from sara_trainer.config import TrainerConfig
    from sara_trainer.updating import Updater

    model, tok = tiny
    group = BatchGroup(group_id="g1", prompt_id="p", prompt=prompt, rollouts=[
        BatchRollout(rollout_id=f"g1:{i}", completion="3", reward=float(i), completion_tokens=1,
                     policy_version=0, token_ids=[5], logprobs=[-1.0]) for i in range(2)])
    fake = types.SimpleNamespace(config=TrainerConfig(model="x"), tokenizer=tok, model=model)
    rows = Updater.rows(fake, [group])
    assert rows.prompt_ids[0] == rows.prompt_ids[1]
    return rows.prompt_ids[0]


def test_template_is_applied_with_the_generation_prompt(tiny):
    _, tok = tiny
    assert render_text(tok, CHAT) == "<bos>system: be brief\nuser: 1+2=?\nassistant: "
    ids = render_prompt(tok, CHAT)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1  # no second BOS


def test_text_prompts_tokenize_as_before(tiny):
    _, tok = tiny
    assert render_prompt(tok, "1+2=") == list(tok("1+2=")["input_ids"])
    assert _trainer_prompt_ids(tiny, "1+2=") == list(tok(["1+2="])["input_ids"][0])


def test_a_chat_prompt_needs_a_template(tiny):
    _, tok = tiny
    bare = types.SimpleNamespace(chat_template=None)
    with pytest.raises(ValueError, match="chat_template"):
        render_prompt(bare, CHAT)
    assert render_prompt(tok, _rollout(CHAT).prompt) == render_prompt(tok, CHAT)  # models too


@pytest.mark.parametrize("prompt", [CHAT, "1+2="])
def test_hf_worker_generates_from_the_ids_the_trainer_scores(tiny_dir, tiny, monkeypatch,
                                                             prompt):
    from sara_worker.backends import hf

    seen: list[list[int]] = []
    real = hf._Request

    def spy(rollout_id, prompt_ids, *rest, **kw):
        seen.append(list(prompt_ids))
        return real(rollout_id, prompt_ids, *rest, **kw)

    monkeypatch.setattr(hf, "_Request", spy)

    async def generate():
        backend = hf.HFBackend(str(tiny_dir), seed=0, max_batch=1, threads=1)
        try:
            return await backend.generate(_rollout(prompt), 0)
        finally:
            await backend.close()

    gen = asyncio.run(generate())
    assert gen.token_ids  # it generated after those prompt ids
    assert seen == [_trainer_prompt_ids(tiny, prompt)]


def test_the_hf_worker_renders_a_repeated_prompt_once_and_a_reload_keeps_it(tiny_dir, tiny):
    from sara_worker.backends import hf

    async def generate_twice():
        backend = hf.HFBackend(str(tiny_dir), seed=0, max_batch=1, threads=1)
        try:
            await backend.generate(_rollout(CHAT), 0)
            rendered = backend._loaded.rendered
            await backend.load_policy(1, str(tiny_dir))   # weights in place: same tokenizer
            await backend.generate(_rollout(CHAT), 1)
            return rendered, backend._loaded.rendered
        finally:
            await backend.close()

    before, after = asyncio.run(generate_twice())
    assert after is before and len(after) == 1
    assert after(CHAT) == _trainer_prompt_ids(tiny, CHAT)


class _CountingTokenizer:
    """The tiny tokenizer, counting its calls."""

    def __init__(self, tok) -> None:
        self.tok, self.calls = tok, 0
        self.chat_template = tok.chat_template

    def __call__(self, *args, **kw):
        self.calls += 1
        return self.tok(*args, **kw)

    def apply_chat_template(self, *args, **kw):
        return self.tok.apply_chat_template(*args, **kw)


def test_rendered_prompts_give_render_prompts_ids_and_tokenize_each_prompt_once(tiny):
    _, tok = tiny
    counting = _CountingTokenizer(tok)
    rendered = RenderedPrompts(counting, maxsize=2)
    for _ in range(3):
        assert rendered("1+2=") == render_prompt(tok, "1+2=")
        assert rendered(CHAT) == render_prompt(tok, CHAT)
    assert counting.calls == 2 and len(rendered) == 2
    rendered("1+2=").append(99)            # a caller's list is its own
    assert rendered("1+2=") == render_prompt(tok, "1+2=")
    assert rendered(_rollout(CHAT).prompt) == render_prompt(tok, CHAT)   # chat models alike
    assert counting.calls == 2


def test_rendered_prompts_forget_the_least_recently_used_past_maxsize(tiny):
    _, tok = tiny
    counting = _CountingTokenizer(tok)
    rendered = RenderedPrompts(counting, maxsize=2)
    rendered("1+1="), rendered("1+2="), rendered("1+1="), rendered("1+3=")   # evicts 1+2=
    assert counting.calls == 3 and len(rendered) == 2
    rendered("1+1=")
    assert counting.calls == 3
    rendered("1+2=")
    assert counting.calls == 4
    with pytest.raises(ValueError, match="maxsize"):
        RenderedPrompts(tok, maxsize=0)


def test_a_text_and_a_chat_prompt_never_share_a_key():
    assert prompt_key("user: hi") != prompt_key([{"role": "user", "content": "hi"}])
    assert prompt_key([{"role": "user", "content": "hi"}]) == (("user", "hi"),)


def test_vllm_engine_input_is_the_trainers_ids(tiny):
    """The vllm backend turns a chat prompt into prompt_token_ids with the engine's tokenizer
    (here a stand-in engine: vLLM's own engine is exercised in tests/backends/test_vllm.py)."""
    from sara_worker.backends.vllm import VLLMBackend

    _, tok = tiny
    backend = VLLMBackend.__new__(VLLMBackend)  # no engine start: only the input path runs
    backend.engine = types.SimpleNamespace(get_tokenizer=lambda: tok)
    backend._tokenizer, backend._render = None, False
    engine_input = asyncio.run(backend.engine_input(_rollout(CHAT).prompt))
    assert engine_input == {"prompt_token_ids": _trainer_prompt_ids(tiny, CHAT)}
    assert asyncio.run(backend.engine_input("1+2=")) == "1+2="  # text: the engine tokenizes


def test_openai_backend_refuses_chat_prompts_with_a_reason():
    from sara_worker.backends.openai import OpenAIBackend

    backend = OpenAIBackend.__new__(OpenAIBackend)
    with pytest.raises(ValueError, match="plain-text"):
        backend.request_body(_rollout(CHAT))


def test_trainer_sampling_encodes_chat_prompts_the_same_way(tiny):
    from sara_trainer.policy import encode_prompts, prompt_text

    _, tok = tiny
    assert encode_prompts(tok, [{"prompt": CHAT}, "1+2="]) == \
        [_trainer_prompt_ids(tiny, CHAT), _trainer_prompt_ids(tiny, "1+2=")]
    assert prompt_text({"prompt": CHAT}) == "be brief\n1+2=?"


def test_gsm8k_recipe_through_the_hf_worker_and_a_trainer_step(tmp_path):
    """The CPU path end to end: fixture GSM8K rows through the gsm8k recipe (chat prompts), the
    hf backend generating with logprobs, and a trainer step that recomputes them. The importance
    ratio is 1 only if the trainer scored the completions after the very prompt tokens the worker
    generated from (a raw-text tokenization of the messages would move it)."""
    need("torch", "torch (the trainer extra; CI installs it)")
    from pathlib import Path

    import sara_client
    from sara_integrations.data import load_prompts, mapping_for
    from sara_trainer.config import TrainerConfig
    from sara_trainer.loop import Trainer
    from sara_trainer.tiny import TinyConfig, build_tiny_policy
    from sara_worker.backends.hf import HFBackend

    data = Path(__file__).resolve().parents[1] / "fixtures" / "data" / "gsm8k_sample.jsonl"
    prompts = load_prompts(str(data), mapping_for("gsm8k")).prompts
    policy = build_tiny_policy(tmp_path / "policy", TinyConfig(context=320))  # prompts ~250 chars
    cfg = TrainerConfig(model=str(policy), checkpoint_dir=str(tmp_path / "ckpt"),
                        lr=1e-3, checkpoint_every=1,
                        keep_checkpoints=1, batch_wait_s=0.0, threads=1, max_steps=1)
    with sara_client.local(data_dir=tmp_path / "redis", redis_url=None, group_size=4,
                           batch_size=2, prefetch_batches=1, max_tokens=6,
                           max_staleness=4) as sara:
        sara.add_prompts(prompts)
        asyncio.run(_hf_fill(sara, HFBackend(str(policy), seed=0, max_batch=16, threads=1)))
        [report] = Trainer(sara, cfg).run(timeout_s=5)
    m = report.metrics
    assert m["off_policy"] == 1.0 and report.groups == 2    # used the worker's logprobs
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["ratio_max"] == pytest.approx(1.0, abs=1e-3)  # no single token scored elsewhere


async def _hf_fill(sara, backend) -> None:
    """Lease, generate with the hf backend, report right/wrong alternately (mixed groups)."""
    seen: dict[str, int] = {}
    try:
        for _ in range(50):
            lease = sara.lease("hf", max_rollouts=64)
            if not lease.rollouts:
                return
            gens = await asyncio.gather(*(backend.generate(r, lease.policy.version)
                                          for r in lease.rollouts))
            results = []
            for r, g in zip(lease.rollouts, gens):
                seen[r.group_id] = seen.get(r.group_id, -1) + 1
                results.append({"rollout_id": r.rollout_id, "reward": float(seen[r.group_id] % 2),
                                "policy_version": lease.policy.version,
                                "completion": g.completion,
                                "completion_tokens": g.completion_tokens,
                                "finish_reason": g.finish_reason, "token_ids": g.token_ids,
                                "logprobs": g.logprobs})
            sara.report("hf", results)
        raise AssertionError("the scheduler never stopped issuing rollouts")
    finally:
        await backend.close()


def test_a_kept_group_takes_its_baseline_over_every_reward_it_drew(tiny):
    """Updater.rows passes a group's drawn_rewards (Reinforce-Ada's kept groups) to the
    advantage: Dr. GRPO's baseline is then the mean of all 8 drawn, not of the 2 kept."""
    from sara_trainer.config import TrainerConfig
    from sara_trainer.updating import Updater

    model, tok = tiny
    group = BatchGroup(group_id="g1", prompt_id="p", prompt="1+2=?", rollouts=[
        BatchRollout(rollout_id=f"g1:{i}", completion="3", reward=float(i), completion_tokens=1,
                     policy_version=0, token_ids=[5], logprobs=[-1.0]) for i in range(2)],
        drawn_rewards=[0.0, 1.0] + [0.0] * 6)
    for on, want in ((True, [-0.125, 0.875]), (False, [-0.5, 0.5])):
        config = TrainerConfig(model="x", advantage_estimator="dr_grpo", drawn_baseline=on)
        fake = types.SimpleNamespace(config=config, tokenizer=tok, model=model)
        assert Updater.rows(fake, [group]).advantages == want
