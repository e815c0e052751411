"""The hf backend (transformers, batched) on the tiny policy, directly and through the scheduler."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import pytest

from sara_worker.backends import create_backend
from sara_worker.backends.hf import HFBackend

from . import _common
from ._common import CONTEXT, rollout, token_of

pytestmark = pytest.mark.anyio


@pytest.fixture
async def hf(tiny_policy):
    import torch

    threads = torch.get_num_threads()
    # one torch thread: two spinning OpenMP threads on a shared 2-core box are far slower
    backend = HFBackend(str(tiny_policy), seed=0, max_batch=16, batch_window_s=0.005, threads=1)
    try:
        yield backend
    finally:
        await backend.close()
        torch.set_num_threads(threads)  # the option is process-wide: leave it as it was


class TorchThreadGate:
    """Pauses an hf backend between decoding steps by blocking its (single) torch thread."""

    def __init__(self, backend: HFBackend) -> None:
        self.backend = backend
        self.release = threading.Event()

    async def pause(self) -> None:
        self.release.clear()
        self.backend._executor.submit(self.release.wait, 60)

    async def resume(self) -> None:
        self.release.set()


def test_registry_builds_hf(tiny_policy):
    backend = create_backend("hf", model=str(tiny_policy), seed=1)
    assert isinstance(backend, HFBackend) and backend.name == "hf"


async def test_generation_is_batched_and_seeded(hf):
    busy = hf.busy_s
    await _common.check_generation(hf)
    assert max(hf.batch_sizes) > 1  # concurrent calls shared a batch
    assert hf.busy_s > busy         # decoding time is counted


async def test_batched_greedy_equals_one_at_a_time(hf):
    prompts = ["1+2=", "hello world 12345", "a", "(3*4)-5="]
    alone = [await hf.generate(rollout(f"one:{i}", p, temperature=0.0, max_tokens=20), 0)
             for i, p in enumerate(prompts)]
    together = await asyncio.gather(*(hf.generate(
        rollout(f"all:{i}", p, temperature=0.0, max_tokens=20), 0) for i, p in enumerate(prompts)))
    assert hf.batch_sizes[-1] == len(prompts)  # left-padded into one batch
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids and a.completion == b.completion
        assert all(math.isclose(x, y, abs_tol=1e-4) for x, y in zip(a.logprobs, b.logprobs))


async def test_abort_mid_generation_returns_what_it_had(hf, constant_policies):
    await hf.load_policy(1, str(constant_policies["a"]))
    gate = TorchThreadGate(hf)
    await _common.check_direct_abort(hf, "a", token_of(constant_policies["a"], "a"),
                                     gate.pause, gate.resume)
    await _common.abort_unknown_is_noop(hf)


async def test_abort_of_a_queued_rollout_answers_at_once(hf, constant_policies):
    await hf.load_policy(1, str(constant_policies["a"]))
    gate = TorchThreadGate(hf)
    first = asyncio.ensure_future(hf.generate(rollout("q:0", "xyz", max_tokens=40), 1))
    assert await hf.wait_tokens(["q:0"], 1, 60)
    await gate.pause()
    try:
        queued = asyncio.ensure_future(hf.generate(rollout("q:1", "xyz", max_tokens=40), 1))
        await asyncio.sleep(0)  # let it reach the queue (one scheduling step, not a timed wait)
        await hf.abort("q:1")
        gen = await asyncio.wait_for(queued, 30)  # answered while the batch is still blocked
        assert (gen.finish_reason, gen.completion_tokens, gen.completion) == ("abort", 0, "")
        assert not first.done()
    finally:
        await gate.resume()
    assert (await first).completion == "a" * 40


async def test_cancel_list_aborts_reissued_copies(hf, make_scheduler, constant_policies):
    gate = TorchThreadGate(hf)
    await _common.check_cancel_list(hf, make_scheduler, constant_policies["a"],
                                    token_of(constant_policies["a"], "a"), gate.pause,
                                    gate.resume)


async def test_policy_versions_switch_weights(hf, make_scheduler, tiny_policy,
                                              constant_policies):
    await _common.check_policy_switch(hf, make_scheduler, tiny_policy, constant_policies)


async def test_no_model_is_a_clear_error_and_a_checkpoint_fixes_it(tiny_policy):
    backend = HFBackend()
    try:
        with pytest.raises(RuntimeError, match="no model"):
            await backend.generate(rollout("n:0", "1+1=", max_tokens=2), 0)
        await backend.load_policy(1, None)  # no checkpoint: nothing to load
        with pytest.raises(RuntimeError, match="no model"):
            await backend.generate(rollout("n:1", "1+1=", max_tokens=2), 1)
        await backend.load_policy(2, str(tiny_policy))
        gen = await backend.generate(rollout("n:2", "1+1=", max_tokens=2), 2)
        assert gen.completion_tokens == 2 and backend.policy_version == 2
    finally:
        await backend.close()


async def test_prompt_longer_than_the_context_is_an_error(hf):
    with pytest.raises(ValueError, match="context"):
        await hf.generate(rollout("long:0", "x" * (CONTEXT + 10), max_tokens=4), 0)


async def test_a_cancelled_caller_is_dropped_from_the_batch(hf, constant_policies):
    await hf.load_policy(1, str(constant_policies["a"]))
    keep = asyncio.ensure_future(hf.generate(rollout("c:0", "xyz", max_tokens=50), 1))
    gone = asyncio.ensure_future(hf.generate(rollout("c:1", "xyz", max_tokens=50), 1))
    assert await hf.wait_tokens(["c:0", "c:1"], 1, 60)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert (await keep).completion_tokens == 50
    assert hf.tokens_so_far("c:1") is None and "c:1" not in hf.inflight_ids()


def _logits(model):
    import torch

    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        return model(ids).logits


async def test_a_checkpoint_of_the_same_model_is_copied_into_the_loaded_one(hf, tiny_policy,
                                                                            tiny_policy_alt,
                                                                            tmp_path):
    from transformers import AutoModelForCausalLM

    await hf.generate(rollout("w:0", "1+1=", max_tokens=2), 0)
    model = hf._loaded.model
    await hf.load_policy(1, str(tiny_policy_alt))           # same config, other weights
    assert hf._loaded.model is model and hf._loaded.source == str(tiny_policy_alt)
    fresh = AutoModelForCausalLM.from_pretrained(str(tiny_policy_alt)).eval()
    assert (_logits(model) - _logits(fresh)).abs().max() < 1e-5   # tied head followed too
    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        (weights_only / name).write_bytes((tiny_policy / name).read_bytes())
    await hf.load_policy(2, str(weights_only))              # no tokenizer: the loaded one kept
    assert hf._loaded.model is model
    base = AutoModelForCausalLM.from_pretrained(str(tiny_policy)).eval()
    assert (_logits(model) - _logits(base)).abs().max() < 1e-5
    gen = await hf.generate(rollout("w:1", "1+1=", temperature=0.0, max_tokens=3), 2)
    assert gen.completion_tokens == 3


async def test_the_loaded_model_runs_gelu_new_as_the_fused_kernel(hf, tiny_policy_alt):
    from sara_client.hf_kernels import UNFUSED_GELU

    await hf.generate(rollout("g:0", "1+1=", max_tokens=2), 0)
    for version, source in ((0, None), (1, str(tiny_policy_alt))):   # loaded, then reloaded
        if source:
            await hf.load_policy(version, source)
        kinds = {type(m).__name__ for m in hf._loaded.model.modules()}
        assert UNFUSED_GELU not in kinds and "GELU" in kinds, version


def _edited_copy(source, dest, name, **changes):
    """A copy of checkpoint `source` at `dest` with JSON file `name` changed."""
    dest.mkdir()
    for f in source.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    (dest / name).write_text(json.dumps({**json.loads((source / name).read_text()), **changes}))
    return dest


async def test_another_config_or_tokenizer_builds_the_model_anew(hf, tiny_policy, tmp_path):
    await hf.generate(rollout("r:0", "1+1=", max_tokens=2), 0)
    model = hf._loaded.model
    await hf.load_policy(1, str(_edited_copy(tiny_policy, tmp_path / "tok", "tokenizer_config.json",
                                             model_max_length=12345)))
    assert hf._loaded.model is not model and hf._loaded.tokenizer.model_max_length == 12345
    model = hf._loaded.model
    # the same weights, another model
    await hf.load_policy(2, str(_edited_copy(tiny_policy, tmp_path / "cfg", "config.json",
                                             layer_norm_epsilon=1e-3)))
    assert hf._loaded.model is not model and hf._loaded.model.config.layer_norm_epsilon == 1e-3
