"""`SaraReplayBuffer` through verl 0.9.1's own classes: verl's trainer builds it from the
recipe's config (`PPOTrainer._build_replay_buffer`, loading `pkg://sara_integrations.verl`), its
`sample()` writes SARA's batch into a real TransferQueue (a local Ray in this process) and
returns the `KVBatchMeta`, and verl's own `PPOTrainer` steps that need no model run on those
keys (`_compute_old_log_prob` in bypass mode, `_compute_advantage`, `_compute_metrics`,
`_balance_batch`): GRPO advantages per SARA group, none of them all zero. SARA is the real app served over HTTP on
the tests' real Redis; a real `sara worker --backend hf` process on the tiny policy generates
(the separate mode)."""

from __future__ import annotations

import logging
import queue
import re
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests._need import need

need("verl.trainer.ppo.v1.replay_buffer", "verl 0.9's v1 trainer (CI installs verl 0.9.1)")
need("transfer_queue", "TransferQueue (CI installs it with verl)")

import torch  # noqa: E402
from sara_client import SaraClient  # noqa: E402
from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402

from sara_integrations.verl import SaraReplayBuffer  # noqa: E402
from sara_integrations.verl.settings import SaraVerlSettings  # noqa: E402

from ._verl import K, SaraWorker, verl_config  # noqa: E402


def built_by_verl(cfg):
    """The replay buffer verl's trainer builds from ``cfg`` (its own `_build_replay_buffer`),
    and the trainer stand-in it was built for (config and trainer mode only)."""
    trainer = SimpleNamespace(
        config=cfg, trainer_mode=cfg.trainer.v1.trainer_mode, use_critic=False,
        _add_prompts_to_generate=lambda n: n, _get_n_gpus_for_throughput=lambda: 1,
        _rollout_moe_lb_metrics_accumulator=RolloutMoELoadBalanceMetricsAccumulator(
            model_config=cfg.actor_rollout_ref.model))
    return PPOTrainer._build_replay_buffer(trainer), trainer


def advantages(tq, trainer, meta):
    """verl's `PPOTrainer._compute_old_log_prob` (bypass mode: the rollout's own logprobs, no
    actor needed) and `_compute_advantage` on the sampled keys; the advantage of each row (one
    value per response, GRPO's), read back from TransferQueue."""
    PPOTrainer._compute_old_log_prob(trainer, meta, {})
    PPOTrainer._compute_advantage(trainer, meta, {})
    data = tq.kv_batch_get(keys=meta.keys, partition_id="train",
                           select_fields=["advantages", "response_mask"])
    adv = data["advantages"].to_padded_tensor(padding=0.0)
    return adv[:, 0]


def test_verl_builds_it_and_trains_on_sara_groups(ray_tq, sara_url, tiny_llama_dir, tmp_path):
    cfg = verl_config("sara_separate", sara_url, tiny_llama_dir,
                      "algorithm.rollout_correction.bypass_mode=true")
    buffer, trainer = built_by_verl(cfg)
    assert isinstance(buffer, SaraReplayBuffer) and buffer.settings.mode == "separate"
    with SaraWorker(sara_url, tiny_llama_dir, tmp_path / "worker.log"):
        meta, metrics = buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert len(meta.keys) == 2 * K and metrics["sara/groups_committed"] >= 2
    uids = [key.split("_")[0] for key in meta.keys]     # the replay buffer's own key parsing
    assert len(set(uids)) == 2 and all(uids.count(u) == K for u in set(uids))
    assert {t["status"] for t in meta.tags} == {"success"}
    assert all(t["min_global_steps"] == t["max_global_steps"] == 0 for t in meta.tags)

    rows = ray_tq.kv_batch_get(keys=meta.keys, partition_id="train",
                               select_fields=["rm_scores", "responses", "num_turns"])
    rewards = torch.stack([s.sum() for s in rows["rm_scores"].unbind()])
    assert rows["responses"].is_nested and rows["num_turns"].tolist() == [2] * (2 * K)
    adv = advantages(ray_tq, trainer, meta)
    for j in range(0, 2 * K, K):
        r = rewards[j:j + K]
        assert 0 < r.sum() < K                           # mixed: SARA delivers no pure group
        expected = (r - r.mean()) / (r.std() + 1e-6)
        assert torch.allclose(adv[j:j + K], expected, atol=1e-4)
        assert adv[j:j + K].abs().sum() > 0
    # the step's metrics, as verl logs them: its own reader of the fields and tags written
    metrics: dict = {}
    PPOTrainer._compute_metrics(trainer, meta, metrics, {"step": 1.0}, global_steps=1, epoch=0)
    assert metrics["training/num_turns/mean"] == 2
    assert metrics["training/off_policy/trajectory_staleness/max"] == 0
    assert metrics["critic/score/mean"] == pytest.approx(rewards.mean().item())
    # verl's balancing across data-parallel ranks (two of them here) reads the tags' seq_len
    trainer.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": [0, 1]})
    trainer.global_steps, trainer.tokenizer = 1, SimpleNamespace(eos_token_id=2)
    trainer._get_required_batch_multiple = lambda dp: PPOTrainer._get_required_batch_multiple(
        trainer, dp)
    balanced = PPOTrainer._balance_batch(trainer, meta, metrics={})
    assert sorted(balanced.keys) == sorted(meta.keys)


def test_next_step_acks_and_publishes_the_saved_weights(ray_tq, sara_url, tiny_llama_dir,
                                                        tmp_path):
    cfg = verl_config("sara_separate", sara_url, tiny_llama_dir,
                      f"trainer.default_local_dir={tmp_path}")
    buffer, _ = built_by_verl(cfg)
    with SaraClient(sara_url) as sara, SaraWorker(sara_url, tiny_llama_dir, tmp_path / "w.log"):
        buffer.sample(global_steps=1, partition_id="train", batch_size=2)
        # step 1 saved no weights: v1 is not published (the workers could not load it)
        buffer.sample(global_steps=2, partition_id="train", batch_size=2)
        assert sara.get_policy().version == 0 and sara.stats().counters.batches_acked == 1
        saved = tmp_path / "global_step_2" / "actor" / "huggingface"
        shutil.copytree(tiny_llama_dir, saved)        # as verl saves hf_model: the worker loads it
        buffer.sample(global_steps=3, partition_id="train", batch_size=2)
        policy = sara.get_policy()
        assert (policy.version, policy.checkpoint) == (2, str(saved))
        assert sara.stats().counters.batches_acked == 2
        meta, _ = buffer.sample(global_steps=4, partition_id="train", batch_size=2)
        # the worker loads verl's weights when it next polls the policy, and says so on its next
        # lease: a batch can come before that, from rollouts leased under v0
        deadline = time.monotonic() + 60
        while (version := _worker_version(sara, "fleet-0")) != 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    assert version == 2                                 # the worker loaded verl's weights
    assert {t["max_global_steps"] for t in meta.tags} <= {0, 2}


def _worker_version(sara: SaraClient, worker_id: str) -> int | None:
    return {w.worker_id: w.policy_version for w in sara.stats().workers}.get(worker_id)


class WaitingLines(logging.Handler):
    """The sampler's 'waiting for SARA's batch' lines, as they are logged (any thread)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: queue.Queue[str] = queue.Queue()

    def emit(self, record: logging.LogRecord) -> None:
        if "waiting for SARA's batch" in record.getMessage():
            self.lines.put(record.getMessage())

    def next_matching(self, pattern: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if re.search(pattern, line):
                return line


@pytest.fixture
def waiting_lines():
    logger, handler = logging.getLogger("sara.verl"), WaitingLines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_it_waits_while_good_prompts_are_scarce(ray_tq, sara_url, tiny_llama_dir, waiting_lines,
                                                tmp_path):
    """No prompt can make a batch yet (every rollout fails): sample() waits, it does not
    raise, and says why; it returns once mixed groups come."""
    cfg = verl_config("sara_separate", sara_url, tiny_llama_dir,
                      "+trainer.v1.sampler.sampler_kwargs.poll_s=0.2")
    buffer, _ = built_by_verl(cfg)
    out: dict = {}
    sampling = threading.Thread(target=lambda: out.update(meta=buffer.sample(
        global_steps=1, partition_id="train", batch_size=2)[0]), daemon=True)
    with SaraClient(sara_url) as sara:
        sampling.start()
        for _ in range(40):           # every result a failure: groups only abandon
            lease = sara.lease("fleet-fail", max_rollouts=16, wait_s=0.2)
            if lease.rollouts:
                sara.report("fleet-fail", [{"rollout_id": r.rollout_id, "reward": 0.0,
                                            "token_ids": [2], "policy_version": 0}
                                           for r in lease.rollouts])
        line = waiting_lines.next_matching(
            r"0 ready groups.* [1-9][0-9]*% of decided groups abandoned")   # after abandons
        assert "(run running)" in line and sampling.is_alive() and "meta" not in out
        with SaraWorker(sara_url, tiny_llama_dir, tmp_path / "worker.log"):
            sampling.join(timeout=90)
    assert len(out["meta"].keys) == 2 * K


def test_validation_is_verls_own_sample(ray_tq, sara_url, tiny_llama_dir):
    """partition 'val' samples what verl's agent loop put there, through the base class."""
    cfg = verl_config("sara_separate", sara_url, tiny_llama_dir)
    buffer, _ = built_by_verl(cfg)
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    ray_tq.kv_batch_put(keys=["v1"], partition_id="val",
                        tags=[{"is_prompt": True, "status": "finished", "global_steps": 0}])
    ray_tq.kv_batch_put(keys=["v1_0_0"], partition_id="val",
                        fields=list_of_dict_to_tensordict([{"x": torch.arange(3)}]),
                        tags=[{"status": "success", "global_steps": 0}])
    meta, _ = buffer.sample(global_steps=0, partition_id="val", batch_size=1)
    assert meta.keys == ["v1_0_0"]
    ray_tq.kv_clear(keys=["v1_0_0"], partition_id="val")


@pytest.mark.parametrize("kwargs, message", [
    ({}, "url is required"),
    ({"url": "http://x", "mod": "colocated"}, "unknown key(s) mod"),
    ({"url": "http://x", "mode": "both"}, "choose colocated or separate"),
    ({"url": "http://x", "max_in_flight": 0}, "max_in_flight must be > 0"),
])
def test_settings_name_the_key_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SaraVerlSettings.from_kwargs(kwargs)


def test_checkpoint_dir_and_tokenizer_come_from_verls_own_keys(tiny_llama_dir):
    cfg = verl_config("sara_colocated", "http://sara:8000", tiny_llama_dir,
                      "trainer.default_local_dir=/ck")
    kwargs = cfg.trainer.v1.sampler.sampler_kwargs
    assert (kwargs.tokenizer, kwargs.checkpoint_dir, kwargs.mode) == (
        str(Path(tiny_llama_dir)), "/ck", "colocated")


@pytest.mark.parametrize("recipe", ["sara_colocated", "sara_separate"])
def test_the_recipes_pass_verls_own_config_checks(recipe):
    """As shipped (no override): what `main_ppo` checks before it starts anything."""
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from ._verl import RECIPES

    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        cfg = compose(config_name=recipe)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg),
                    use_critic=need_critic(cfg))
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.data.train_batch_size == 32
    assert cfg.trainer.v1.sampler.sampler_kwargs.mode == recipe.removeprefix("sara_")
