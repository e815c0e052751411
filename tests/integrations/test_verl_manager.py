"""`SaraAgentLoopManager` (colocated mode) through verl 0.9.1's own classes: verl loads it by the
recipe's ``agent_loop_manager_class`` and builds it as its TaskRunner does (``create(config=,
llm_client=, teacher_client=, reward_loop_worker_handles=)``) with verl's real `LLMServerClient`
over verl's real load balancer, and verl's real `RewardLoopWorker` (its GSM8K scorer). The
sampler verl builds from the same config drives it: the manager leases from SARA, generates each
rollout as one request on the rollout server, scores it, reports it, and stops when the batch is
there. The rollout server is the stand-in named in `_verl.py` (verl's vLLM server needs a GPU).

Validation runs verl's own agent-loop worker against the same server.

Failure handling: a rollout the server holds is aborted on the server when the step's batch is
complete and handed back to SARA, which re-issues it alone; one the server fails on is reported
as an error and re-issued the same way; neither group is lost."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from tests._need import need

need("verl.trainer.ppo.v1.agent_loop_tq", "verl 0.9's v1 agent loop (CI installs verl 0.9.1)")
need("transfer_queue", "TransferQueue (CI installs it with verl)")

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from sara_client import SaraClient  # noqa: E402
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.utils.import_utils import load_class_from_fqn  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.rollout.llm_server import LLMServerClient  # noqa: E402
from verl.workers.rollout.router import get_router_handle  # noqa: E402

from sara_integrations.verl import SaraAgentLoopManager  # noqa: E402

from ._verl import K, StandInServer, verl_config  # noqa: E402


def rollout_of(request_id: str) -> str:
    """The SARA rollout of a request the manager sent (``sara-<group>:<slot>-<nonce>``)."""
    return request_id[len("sara-"):].rsplit("-", 1)[0]


def group_of(request_id: str) -> str:
    """The SARA group of a request the manager sent."""
    return rollout_of(request_id).rpartition(":")[0]


@pytest.fixture
def colocated(ray_tq, sara_url, tiny_llama_dir):
    """verl's pieces as its TaskRunner wires them, in colocated mode, around the stand-in."""
    cfg = verl_config("sara_colocated", sara_url, tiny_llama_dir,
                      "actor_rollout_ref.rollout.agent.num_workers=0", "reward.num_workers=1",
                      "+trainer.v1.sampler.sampler_kwargs.poll_s=0.5",
                      "algorithm.rollout_correction.bypass_mode=true")
    server = StandInServer.remote(str(tiny_llama_dir))
    balancer = get_router_handle(servers={"stand-in:0": server})
    reward = ray.remote(RewardLoopWorker).remote(cfg, None)
    manager_cls = load_class_from_fqn(cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class,
                                      "AgentLoopManager")
    manager = manager_cls.create(config=cfg, llm_client=LLMServerClient(cfg, balancer),
                                 teacher_client=None, reward_loop_worker_handles=[reward])
    trainer = SimpleNamespace(config=cfg, trainer_mode="sync", _add_prompts_to_generate=lambda n: n)
    buffer = PPOTrainer._build_replay_buffer(trainer)
    try:
        yield SimpleNamespace(cfg=cfg, server=server, manager=manager, buffer=buffer,
                              trainer=trainer, tq=ray_tq)
    finally:
        manager.session.close()
        for actor in (server, balancer, reward):
            ray.kill(actor)


def submit_dataloader_prompts(tq, manager, n: int) -> list[str]:
    """What verl's `PPOTrainer._submit_batch_to_rollout` does with a dataloader batch."""
    uids = [f"dl{i}" for i in range(n)]
    batch = tu.get_tensordict({"uid": np.array(uids, dtype=object)})
    tq.kv_batch_put(keys=uids, partition_id="train",
                    tags=[{"is_prompt": True, "status": "pending", "global_steps": 1}] * n)
    manager.generate_sequences(batch)
    return uids


def test_colocated_step_generates_on_verls_server_and_trains_on_mixed_groups(colocated):
    c = colocated
    assert isinstance(c.manager, SaraAgentLoopManager) and c.manager.session is not None
    uids = submit_dataloader_prompts(c.tq, c.manager, 2)
    assert not set(uids) & set((c.tq.kv_list("train") or {}).get("train", {}))
    meta, _ = c.buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    assert len(meta.keys) == 2 * K
    rows = c.tq.kv_batch_get(keys=meta.keys, partition_id="train",
                             select_fields=["rm_scores", "rollout_log_probs", "responses"])
    rewards = torch.stack([s.sum() for s in rows["rm_scores"].unbind()])
    assert set(rewards.tolist()) == {0.0, 1.0}          # verl's GSM8K scorer: right or wrong
    assert torch.allclose(rows["rollout_log_probs"].values(), torch.tensor(-0.25))
    PPOTrainer._compute_old_log_prob(c.trainer, meta, {})
    PPOTrainer._compute_advantage(c.trainer, meta, {})
    adv = c.tq.kv_batch_get(keys=meta.keys, partition_id="train",
                            select_fields=["advantages"])["advantages"].to_padded_tensor(0.0)
    for j in range(0, 2 * K, K):
        assert 0 < rewards[j:j + K].sum() < K and adv[j:j + K, 0].abs().sum() > 0
    with SaraClient(c.cfg.trainer.v1.sampler.sampler_kwargs.url) as sara:
        stats = sara.stats()
    assert stats.queues.leased == 0 and not c.manager.session.held      # paused, nothing held
    worker = {w.worker_id: w for w in stats.workers}["verl"]
    assert worker.rollouts_completed >= 2 * K
    generated = {rollout_of(r) for r in ray.get(c.server.calls.remote())["seen"]}
    assert {t["sara_rollout_id"] for t in meta.tags} <= generated   # each one, on verl's server


def test_aborted_and_failed_rollouts_are_reissued_alone(colocated):
    c = colocated
    # a third of the prompts generate until aborted, a sixth fail: SARA leases some of each
    ray.get(c.server.configure.remote(hold=[f"{i}+{i}=" for i in range(10)],
                                      fail=[f"{i}+{i}=" for i in range(10, 15)]))
    c.buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    calls = ray.get(c.server.calls.remote())
    counts = c.manager.session.counts
    url = c.cfg.trainer.v1.sampler.sampler_kwargs.url
    with SaraClient(url) as sara:
        counters = sara.stats().counters
        held_groups = {group_of(r) for r in calls["held"]}
        assert held_groups, "SARA leased no rollout of the held prompts"
        # the held requests were aborted on the server, through verl's client and balancer
        assert set(calls["held"]) <= set(calls["aborted"]) and counts["aborted"] >= 1
        assert counters.rollouts_errored == counts["errors"] >= 1
        # each failed slot came back to be generated again, alone (SARA counts its third error
        # as a failure, and the group goes on without it)
        failed_slots = Counter(rollout_of(r) for r in calls["failed"])
        assert max(failed_slots.values()) >= 2
        assert counters.rollouts_reissued >= counts["aborted"] + len(failed_slots)
        for gid in held_groups:
            group = sara.get_group(gid)
            assert group.state == "open"                 # its group is kept, not lost
            assert any(s.state == "pending" for s in group.rollouts)
        ray.get(c.server.configure.remote(hold=[], fail=[]))

        def progressed(gid: str) -> bool:      # its re-issued rollouts ran
            group = sara.get_group(gid)
            return group.done > 0 or group.state != "open"

        # a batch can fill from other groups before a held group's re-issued rollouts finish
        # (seen once under CI's load): sample on, a few steps at most, until each has run
        for step in range(2, 7):
            c.buffer.sample(global_steps=step, partition_id="train", batch_size=2)
            if all(progressed(gid) for gid in held_groups):
                break
        assert all(progressed(gid) for gid in held_groups), [
            sara.get_group(gid) for gid in held_groups]


def test_validation_runs_verls_own_agent_loop(ray_tq, sara_url, tiny_llama_dir):
    """A validation batch goes through verl's own AgentLoopWorkerTQ (one here) and its
    single-turn agent loop to the rollout server, and the sampler's base class samples it; SARA
    leases nothing for it."""
    cfg = verl_config("sara_colocated", sara_url, tiny_llama_dir,
                      "actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1",
                      "actor_rollout_ref.rollout.val_kwargs.n=2")
    server = StandInServer.remote(str(tiny_llama_dir))
    balancer = get_router_handle(servers={"s:0": server})
    reward = ray.remote(RewardLoopWorker).remote(cfg, None)
    manager = SaraAgentLoopManager.create(
        config=cfg, llm_client=LLMServerClient(cfg, balancer), teacher_client=None,
        reward_loop_worker_handles=[reward])
    trainer = SimpleNamespace(config=cfg, trainer_mode="sync", _add_prompts_to_generate=lambda n: n)
    buffer = PPOTrainer._build_replay_buffer(trainer)
    try:
        uids = ["val-a", "val-b"]
        batch = tu.get_tensordict({      # what PPOTrainer._validate hands the manager
            "uid": np.array(uids, dtype=object), "index": np.arange(2),
            "raw_prompt": np.array([[{"role": "user", "content": f"{i}+{i}="}] for i in (3, 4)]
                                   + [None], dtype=object)[:2],
            "data_source": np.array(["openai/gsm8k"] * 2, dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": "6"},
                                      {"style": "rule", "ground_truth": "8"}], dtype=object)})
        tu.assign_non_tensor_data(batch, "global_steps", 0)
        tu.assign_non_tensor_data(batch, "validate", True)
        ray_tq.kv_batch_put(keys=uids, partition_id="val", tags=[
            {"is_prompt": True, "status": "pending", "global_steps": 0}] * 2)
        manager.generate_sequences(batch)
        meta, _ = buffer.sample(global_steps=0, partition_id="val", batch_size=2)
        assert sorted(meta.keys) == [f"{u}_{s}_0" for u in uids for s in (0, 1)]
        with SaraClient(sara_url) as sara:
            assert sara.stats().counters.leases_granted == 0
        assert len(ray.get(server.calls.remote())["seen"]) == 4
        ray_tq.kv_clear(keys=meta.keys, partition_id="val")
    finally:
        manager.session.close()
        for actor in (server, balancer, reward):
            ray.kill(actor)
