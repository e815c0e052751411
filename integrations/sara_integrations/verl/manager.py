"""`SaraAgentLoopManager`: verl's agent-loop manager, generating SARA's rollouts on verl's servers.

Loaded through ``+actor_rollout_ref.rollout.agent.agent_loop_manager_class=
sara_integrations.verl.SaraAgentLoopManager``; verl builds it with its rollout-server client and
its reward-loop workers. In colocated mode it runs the :class:`~.session.RolloutSession` that
the sampler drives: each leased rollout is one request on verl's rollout servers (through verl's
own client and load balancer), scored by verl's reward function (``reward.*`` config: the
rule-based scorer picked by ``data_source``, or a custom one), and reported to SARA with its
token ids and logprobs. In separate mode it generates nothing (``sara worker`` fleets do).

Training prompts that verl's dataloader submits are released from TransferQueue unused (SARA
draws from its own pool). Validation batches run verl's own agent loop, unchanged.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from sara_client import SaraClient
from sara_client.models import Rollout
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.llm_server import LLMServerClient

from .rendering import prompt_encoder
from .session import Generated, RolloutSession
from .settings import SaraVerlSettings


def sara_settings(config: Any) -> SaraVerlSettings:
    """SARA's settings from a verl config (``trainer.v1.sampler.sampler_kwargs``)."""
    return SaraVerlSettings.from_kwargs(config.trainer.v1.sampler.get("sampler_kwargs"))


class RolloutClient(LLMServerClient):
    """verl's client to its rollout servers, sending each request under the caller's id so one
    rollout can be aborted where it runs (verl's own client gives vLLM a fresh id per request)."""

    @classmethod
    def sharing(cls, client: LLMServerClient) -> RolloutClient:
        """A client over the same config and load balancer as ``client`` (its state, shared)."""
        twin = cls.__new__(cls)
        twin.__dict__.update(vars(client))
        return twin

    def _vllm_request_id(self, request_id: str) -> str:
        return request_id

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` on the server that runs it (the balancer's sessions are sticky)."""
        server_id, server = await self._acquire_server(request_id)
        try:
            if self.config.actor_rollout_ref.rollout.name == "vllm":
                # keep the prefix cache: other rollouts of the same prompt are still running
                await server.abort_request.remote(request_id, reset_prefix_cache=False)
            else:
                await server.abort_request.remote(request_id)
        finally:
            self._release_server(server_id, request_id)


def reward_input(prompt_ids: list[int], response_ids: list[int], data_source: str,
                 ground_truth: Any, extra_info: dict[str, Any]) -> DataProto:
    """One rollout as verl's reward-loop workers take it (the fields
    ``AgentLoopWorker._compute_score`` sends, for one single-turn output)."""
    prompts = torch.tensor([prompt_ids], dtype=torch.int64)
    responses = torch.tensor([response_ids], dtype=torch.int64).reshape(1, -1)
    input_ids = torch.cat([prompts, responses], dim=1)
    batch = TensorDict({"prompts": prompts, "responses": responses, "input_ids": input_ids,
                        "attention_mask": torch.ones_like(input_ids),
                        "position_ids": torch.arange(input_ids.shape[1]).unsqueeze(0)},
                       batch_size=1)

    def one(value: Any) -> np.ndarray:
        out = np.empty(1, dtype=object)
        out[0] = value
        return out

    return DataProto(batch=batch, non_tensor_batch={
        "data_source": one(data_source),
        "reward_model": one({"style": "rule", "ground_truth": ground_truth}),
        "extra_info": one(dict(extra_info)), "tool_extra_fields": one({}),
        "__num_turns__": np.array([2]), "prompt_len": np.array([len(prompt_ids)]),
        "response_len": np.array([len(response_ids)])})


class VerlEngine:
    """The session's engine on verl: generation on its rollout servers at the trainer's sampling
    settings (``actor_rollout_ref.rollout.*``, which verl's actor takes logprobs at), scoring on
    its reward-loop workers."""

    def __init__(self, client: RolloutClient, reward_workers: list[Any], rollout_config: Any,
                 data_source: str | None) -> None:
        self.client, self.data_source = client, data_source
        self.reward_workers = itertools.cycle(reward_workers)
        self.max_tokens = int(rollout_config.response_length)
        self.sampling = {"temperature": rollout_config.temperature,
                         "top_p": rollout_config.top_p, "top_k": rollout_config.top_k,
                         "repetition_penalty": 1.0,
                         "logprobs": rollout_config.calculate_log_probs}

    async def generate(self, request_id: str, prompt_ids: list[int]) -> Generated:
        out = await self.client.generate(request_id, prompt_ids=prompt_ids,
                                         sampling_params=dict(self.sampling))
        tokens = list(out.token_ids)[:self.max_tokens]
        logprobs = list(out.log_probs)[:len(tokens)] if out.log_probs else None
        return Generated(tokens, logprobs, out.stop_reason)

    async def abort(self, request_id: str) -> None:
        await self.client.abort(request_id)

    async def score(self, rollout: Rollout, prompt_ids: list[int],
                    response_ids: list[int]) -> float:
        meta = dict(rollout.meta or {})
        source = meta.get("data_source") or self.data_source or rollout.task
        data = reward_input(prompt_ids, response_ids, source, rollout.answer, meta)
        answer = await next(self.reward_workers).compute_score.remote(data)
        return float(answer["reward_score"])

    def finish_reason(self, generated: Generated) -> str:
        return "length" if len(generated.token_ids) >= self.max_tokens else "stop"


class SaraAgentLoopManager(AgentLoopManagerTQ):
    """verl's v1 agent-loop manager for SARA (see the module doc). Built by verl's TaskRunner as
    ``create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)``; ``sara``
    (tests) replaces the HTTP client the settings would build."""

    def __init__(self, config: Any, llm_client: Any, teacher_client: Any = None,
                 reward_loop_worker_handles: Any = None, sara: Any = None) -> None:
        super().__init__(config, llm_client, teacher_client, reward_loop_worker_handles)
        self.settings = sara_settings(config)
        self.session: RolloutSession | None = None
        if self.settings.mode != "colocated":
            return
        if not reward_loop_worker_handles:
            raise ValueError("SARA needs each rollout's reward when it is reported: use a "
                             "rule-based reward, or reward.reward_model.enable_resource_pool=True")
        tokenizer = omega_conf_to_dataclass(config.actor_rollout_ref.model).tokenizer
        encode, _ = prompt_encoder(tokenizer)
        engine = VerlEngine(RolloutClient.sharing(llm_client), list(reward_loop_worker_handles),
                            config.actor_rollout_ref.rollout, self.settings.data_source)
        client = sara or SaraClient(self.settings.url,
                                    token=self.settings.worker_token or self.settings.token)
        self.session = RolloutSession(client, engine, self.settings, encode).register()

    def generate_sequences(self, prompts: TensorDict) -> None:
        """Validation: verl's own agent loop. Training: SARA draws its prompts from its own
        pool, so the dataloader's are released from TransferQueue unused."""
        if "validate" in prompts.keys():
            return super().generate_sequences(prompts)
        tq.kv_clear(keys=[str(uid) for uid in prompts["uid"]], partition_id="train")
        return None
