"""The hf backend: a transformers causal LM from a local directory, batched sampling.

Concurrent ``generate`` calls are collected into one batch (up to ``max_batch`` rollouts, waiting at
most ``batch_window_s`` for more to arrive), left-padded, prefilled once and decoded step by step
with the model's KV cache. Each rollout samples with its own ``sampling.temperature``, ``top_p``
and ``seed`` (a seeded rollout draws from its own ``torch.Generator``; temperature 0 is greedy)
and stops at an end-of-sequence token (``"stop"``), at ``max_tokens`` or the model's context
length (``"length"``). A finished or aborted rollout is dropped from the batch (and its KV cache
rows) at the next step and answered at once; an aborted one returns the tokens it had
(``"abort"``). Rollouts that arrive while a batch is being decoded form the next batch.

Per-token logprobs are those of the sampled tokens under the model's raw distribution
(log-softmax of the logits, before temperature and top-p), like vLLM's default; token ids include
the end-of-sequence token, the completion text does not (special tokens are skipped).

Every torch call runs on one dedicated thread, so the event loop (leases, heartbeats, aborts)
stays responsive while the model computes. ``load_policy`` loads the checkpoint directory
(``AutoModelForCausalLM`` and, when the directory has one, its tokenizer) and swaps it in; a policy
without a checkpoint keeps the current weights. When the checkpoint has the loaded model's config
and tokenizer files (a trainer publishing every step) and one ``model.safetensors``, only the
weights are copied into the loaded model: a few milliseconds where building the model again costs
tens, on the torch thread that generates. With no ``model`` option the first policy checkpoint is
the model.

Options: ``model`` (directory), ``device`` (default ``cuda`` when available, else ``cpu``),
``dtype`` (``auto``, ``float32``, ``bfloat16``, ``float16``), ``seed`` (for unseeded rollouts),
``max_batch``, ``batch_window_s``, ``logprobs`` (bool), ``trust_remote_code``, ``threads`` (torch
CPU threads, process-wide; on a busy CPU box 1 thread is often fastest for small models).

Past 400 lines because it is a whole engine in one class: loading (and reloading weights in
place), the continuous batcher, prefill, decode and sampling share the per-request state, and
splitting them would pass that state across modules.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from sara_client.chat import RenderedPrompts
from sara_client.hf_compat import cache_argument, returned_cache
from sara_client.hf_kernels import fuse_gelu
from sara_client.models import Rollout

from .base import BaseBackend, Generation, ObservableProgress
from .hf_sampling import sample

log = logging.getLogger("sara.worker.hf")

# the files a checkpoint's tokenizer is read from (those present are compared)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
# config.json fields that differ between saves of the same model
VOLATILE_CONFIG = ("_name_or_path", "transformers_version")


@dataclasses.dataclass(eq=False)
class _Request:
    """One rollout waiting for, or in, a batch."""

    rollout_id: str
    prompt_ids: list[int]
    temperature: float
    top_p: float
    max_tokens: int
    generator: Any  # torch.Generator for a seeded rollout, else None
    future: asyncio.Future
    aborted: bool = False
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None


@dataclasses.dataclass
class _Loaded:
    model: Any
    tokenizer: Any
    source: str
    context: int | None
    eos_ids: frozenset[int]
    pad_id: int
    config: dict[str, Any] | None = None   # the source's config.json, less VOLATILE_CONFIG
    tokenizer_digest: str = ""             # of the source's TOKENIZER_FILES ("" for none)
    # render_prompt under this tokenizer, remembered (a weights-only reload keeps both)
    rendered: RenderedPrompts = None  # type: ignore[assignment]  # made from the tokenizer

    def __post_init__(self) -> None:
        if self.rendered is None:
            self.rendered = RenderedPrompts(self.tokenizer)


def _config_of(directory: str) -> dict[str, Any] | None:
    """A checkpoint's config.json without the fields that change between saves (None: none)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    return {k: v for k, v in config.items() if k not in VOLATILE_CONFIG}


def _tokenizer_digest(directory: str) -> str:
    """SHA-256 over a checkpoint's tokenizer files ("" when it has none: weights only)."""
    digest, found = hashlib.sha256(), False
    for name in TOKENIZER_FILES:
        path = Path(directory) / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
            found = True
    return digest.hexdigest() if found else ""


class _Batch:
    """Decoding state of one batch: KV cache, attention mask, next positions (torch tensors)."""

    def __init__(self, cache: Any, mask: Any, positions: Any) -> None:
        self.cache, self.mask, self.positions = cache, mask, positions


class HFBackend(ObservableProgress, BaseBackend):
    """transformers generation; see the module docstring for the options."""

    name = "hf"

    def __init__(self, model: str | None = None, *, device: str | None = None,
                 dtype: str = "auto", seed: int | None = None, max_batch: int = 64,
                 batch_window_s: float = 0.005, logprobs: bool = True,
                 trust_remote_code: bool = False, threads: int | None = None) -> None:
        super().__init__()
        import torch

        if threads is not None:
            torch.set_num_threads(int(threads))  # process-wide, like torch itself

        if max_batch < 1 or batch_window_s < 0:
            raise ValueError("max_batch >= 1 and batch_window_s >= 0 are required")
        if dtype != "auto" and not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype {dtype!r} is not a torch dtype name")
        self.model = model
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = dtype
        self.max_batch = int(max_batch)
        self.batch_window_s = float(batch_window_s)
        self.logprobs = bool(logprobs)
        self.trust_remote_code = bool(trust_remote_code)
        self._rng = torch.Generator(device="cpu")
        if seed is None:
            self._rng.seed()
        else:
            self._rng.manual_seed(int(seed))
        self._loaded: _Loaded | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sara-hf")
        self._queue: list[_Request] = []
        self._by_id: dict[str, _Request] = {}
        self._wake = asyncio.Event()
        self._model_lock = asyncio.Lock()
        self._batcher: asyncio.Task | None = None
        self._changed = asyncio.Event()
        self.batches = 0  # batches run (for tests and logs)
        self.batch_sizes: list[int] = []
        self.busy_s = 0.0  # wall seconds spent decoding batches: the engine's generation time

    # --- model -----------------------------------------------------------------------------------

    async def _call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the torch thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _load(self, source: str, previous: _Loaded | None) -> _Loaded:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = "auto" if self.dtype == "auto" else getattr(torch, self.dtype)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, trust_remote_code=self.trust_remote_code)
        fuse_gelu(model)   # the same formula in one kernel: see sara_client.hf_kernels
        model.to(self.device).eval()
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                source, trust_remote_code=self.trust_remote_code)
        except (OSError, ValueError):
            if previous is None:
                raise
            tokenizer = previous.tokenizer  # a weights-only checkpoint keeps the tokenizer
        eos: set[int] = set()
        for value in (getattr(model.generation_config, "eos_token_id", None),
                      tokenizer.eos_token_id):
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, (list, tuple)):
                eos.update(int(v) for v in value)
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = min(eos) if eos else 0
        context = getattr(model.config, "max_position_embeddings", None)
        return _Loaded(model, tokenizer, source, int(context) if context else None,
                       frozenset(eos), int(pad), _config_of(source), _tokenizer_digest(source))

    def _reload(self, source: str, previous: _Loaded | None) -> _Loaded:
        """`source` loaded: its weights copied into `previous`'s model when that is the same
        model (see :meth:`_weights_in_place`), else built anew."""
        kept = self._weights_in_place(source, previous)
        return kept if kept is not None else self._load(source, previous)

    def _weights_in_place(self, source: str, previous: _Loaded | None) -> _Loaded | None:
        """`previous` with `source`'s weights copied into its model, or None when `source` is
        not the same model: another config, another tokenizer, sharded or non-safetensors
        weights, or a state dict whose keys do not match (a missing key is allowed only when it
        is tied to a loaded one, as GPT-2's output embedding is to its input embedding)."""
        weights = Path(source) / "model.safetensors"
        if previous is None or previous.config is None or not weights.is_file() or \
                _config_of(source) != previous.config:
            return None
        digest = _tokenizer_digest(source)
        if digest not in ("", previous.tokenizer_digest):
            return None
        from safetensors.torch import load_file

        state = load_file(str(weights), device=str(self.device))
        model = previous.model
        params = dict(model.named_parameters(remove_duplicate=False))
        expected = set(model.state_dict())
        missing = expected - set(state)
        tied = {k for k in missing if k in params and any(params.get(j) is params[k]
                                                           for j in state)}
        if set(state) - expected or missing - tied:
            return None
        model.load_state_dict(state, strict=False)   # copies in place; tied tensors follow
        return dataclasses.replace(previous, source=source)

    async def _ensure_model(self) -> _Loaded:
        if self._loaded is None:
            async with self._model_lock:
                if self._loaded is None:
                    source = self.checkpoint or self.model
                    if source is None:
                        raise RuntimeError("the hf backend has no model: pass model= (--model) "
                                           "or publish a policy with a checkpoint")
                    self._loaded = await self._call(self._load, source, None)
                    log.info("hf backend loaded %s on %s", source, self.device)
        return self._loaded

    async def load_policy(self, version: int, checkpoint: str | None) -> None:
        """Reload the weights (and tokenizer, when present) from ``checkpoint``."""
        if checkpoint is None:
            log.info("policy v%d has no checkpoint: keeping the current weights", version)
            self.policy_version = version
            return
        async with self._model_lock:  # waits for a running batch to end
            loaded = await self._call(self._reload, checkpoint, self._loaded)
            self._loaded = loaded
        self.policy_version, self.checkpoint = version, checkpoint
        log.info("hf backend now at policy v%d (%s)", version, checkpoint)

    async def close(self) -> None:
        if self._batcher is not None:
            self._batcher.cancel()
            try:
                await self._batcher
            except (asyncio.CancelledError, Exception):
                pass
            self._batcher = None
        for req in self._queue:
            if not req.future.done():
                req.future.cancel()
        self._queue.clear()
        self._loaded = None
        self._executor.shutdown(wait=True)

    # --- generate / abort ------------------------------------------------------------------------

    async def generate(self, rollout: Rollout, policy_version: int) -> Generation:
        import torch

        loaded = await self._ensure_model()
        s = rollout.sampling
        ids = loaded.rendered(rollout.prompt)  # render_prompt: the trainer renders the same way
        if not ids:
            raise ValueError("the prompt tokenizes to nothing")
        if loaded.context is not None and len(ids) >= loaded.context:
            raise ValueError(f"prompt of {len(ids)} tokens does not fit the model's context of "
                             f"{loaded.context}")
        generator = None
        if s.seed is not None:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(int(s.seed))
        req = _Request(rollout.rollout_id, ids, float(s.temperature), float(s.top_p),
                       max(int(s.max_tokens), 0), generator,
                       asyncio.get_running_loop().create_future())
        with self.track(rollout.rollout_id):
            self._by_id[req.rollout_id] = req
            try:
                if req.max_tokens == 0:
                    self._finish(req, "length")
                else:
                    self._queue.append(req)
                    self._wake.set()
                    self._ensure_batcher()
                return await req.future
            finally:
                if not req.future.done() or req.future.cancelled():  # the caller was cancelled
                    req.aborted = True
                    if req in self._queue:
                        self._queue.remove(req)
                if self._by_id.get(req.rollout_id) is req:
                    del self._by_id[req.rollout_id]

    async def abort(self, rollout_id: str) -> None:
        await super().abort(rollout_id)
        req = self._by_id.get(rollout_id)
        if req is None or req.future.done():
            return
        req.aborted = True
        if req in self._queue:  # not in a batch yet: answer now
            self._queue.remove(req)
            self._finish(req, "abort")

    def _finish(self, req: _Request, reason: str) -> None:
        if req.future.done():
            req.aborted = True  # its caller is gone: drop it from the batch
            return
        req.finish_reason = reason
        loaded = self._loaded
        text = ""
        if loaded is not None and req.token_ids:
            text = loaded.tokenizer.decode(req.token_ids, skip_special_tokens=True)
        req.future.set_result(Generation(
            completion=text, completion_tokens=len(req.token_ids), finish_reason=reason,
            token_ids=list(req.token_ids),
            logprobs=list(req.logprobs) if self.logprobs else None))
        self._notify()

    # --- batching --------------------------------------------------------------------------------

    def _ensure_batcher(self) -> None:
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.ensure_future(self._batch_loop())

    async def _batch_loop(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if len(self._queue) < self.max_batch and self.batch_window_s > 0:
                await asyncio.sleep(self.batch_window_s)  # let concurrent calls join the batch
            batch = [r for r in self._queue[:self.max_batch] if not r.future.done()]
            del self._queue[:self.max_batch]
            if not batch:
                continue
            try:
                async with self._model_lock:
                    started = time.perf_counter()
                    try:
                        await self._run(batch)
                    finally:
                        self.busy_s += time.perf_counter() - started
            except Exception as exc:
                log.exception("hf batch of %d failed", len(batch))
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(exc)

    async def _run(self, rows: list[_Request]) -> None:
        """Decode one batch to the end, answering each rollout as soon as it is done."""
        loaded = self._loaded
        assert loaded is not None
        self.batches += 1
        self.batch_sizes.append(len(rows))
        state, sampled = await self._call(self._prefill, loaded, rows)
        while True:
            keep: list[int] = []
            for i, req in enumerate(rows):
                if req.aborted or req.future.done():
                    self._finish(req, "abort")  # dropped before this step's token counts
                    continue
                token, logprob = sampled[i]
                req.token_ids.append(token)
                req.logprobs.append(logprob)
                reason = self._stop_reason(loaded, req, token)
                if reason is not None:
                    self._finish(req, reason)
                else:
                    keep.append(i)
            self._notify()
            if not keep:
                return
            last = [rows[i].token_ids[-1] for i in keep]
            rows = [rows[i] for i in keep]
            sampled = await self._call(self._decode, loaded, state, keep, last, rows)

    @staticmethod
    def _stop_reason(loaded: _Loaded, req: _Request, token: int) -> str | None:
        if token in loaded.eos_ids:
            return "stop"
        if len(req.token_ids) >= req.max_tokens:
            return "length"
        used = len(req.prompt_ids) + len(req.token_ids)
        if loaded.context is not None and used >= loaded.context:
            return "length"
        return None

    # --- torch (on the torch thread) -------------------------------------------------------------

    def _prefill(self, loaded: _Loaded,
                 rows: list[_Request]) -> tuple[_Batch, list[tuple[int, float]]]:
        import torch

        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), loaded.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, req in enumerate(rows):
            n = len(req.prompt_ids)
            ids[i, width - n:] = torch.tensor(req.prompt_ids, dtype=torch.long)
            mask[i, width - n:] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        ids, mask, positions = (t.to(self.device) for t in (ids, mask, positions))
        with torch.inference_mode():
            out = loaded.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True)
        state = _Batch(returned_cache(out), mask, positions[:, -1] + 1)
        return state, self._sample(out.logits[:, -1, :], rows)

    def _decode(self, loaded: _Loaded, state: _Batch, keep: list[int], last: list[int],
                rows: list[_Request]) -> list[tuple[int, float]]:
        import torch

        if len(keep) != state.mask.shape[0]:
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            state.cache.batch_select_indices(index)
            state.mask = state.mask.index_select(0, index)
            state.positions = state.positions.index_select(0, index)
        ones = torch.ones((len(keep), 1), dtype=state.mask.dtype, device=self.device)
        state.mask = torch.cat([state.mask, ones], dim=1)
        ids = torch.tensor(last, dtype=torch.long, device=self.device).unsqueeze(1)
        with torch.inference_mode():
            out = loaded.model(input_ids=ids, attention_mask=state.mask,
                               position_ids=state.positions.unsqueeze(1), use_cache=True,
                               **{cache_argument(loaded.model): state.cache})
        state.cache = returned_cache(out)
        state.positions = state.positions + 1
        return self._sample(out.logits[:, -1, :], rows)

    def _sample(self, logits: Any, rows: list[_Request]) -> list[tuple[int, float]]:
        """One token per row and its raw logprob (see `hf_sampling.sample`)."""
        return sample(logits, [r.temperature for r in rows], [r.top_p for r in rows],
                      lambda picked: self._uniforms([rows[i] for i in picked]))

    def _uniforms(self, rows: list[_Request]) -> Any:
        """One uniform in [0, 1) per row: a seeded row's from its own generator."""
        import torch

        out = torch.empty(len(rows))
        shared = [i for i, r in enumerate(rows) if r.generator is None]
        if shared:
            out[shared] = torch.rand(len(shared), generator=self._rng)
        for i, req in enumerate(rows):
            if req.generator is not None:
                out[i] = torch.rand(1, generator=req.generator)[0]
        return out

    # --- observation (tests) ---------------------------------------------------------------------

    def tokens_so_far(self, rollout_id: str) -> int | None:
        """Tokens generated so far by an in-flight rollout; None when it is not in flight."""
        req = self._by_id.get(rollout_id)
        return None if req is None or req.future.done() else len(req.token_ids)
