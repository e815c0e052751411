"""Policy evaluations in a process of their own, so that the trainer does not stop for them.

A testbed run evaluates its policy 17 times: greedy accuracy on 8,000 held-out problems and a
k-sample probe of fixed pool prompts. On the trainer's thread, when the evaluations moved here,
they were about 40% of a run's wall time (90 of 220 s for a DS run on 2 cores), while the run's
own processes kept only about 1.2 of the 2 cores busy. Here the trainer hands over a copy of its
weights (a few megabytes for the testbed's model) and goes on; one child process, started with
``spawn`` and one torch thread, builds the model once and evaluates each copy in the order
given. The figures are the same computation as on the trainer's thread: the same greedy
decoding, the same seeded probe.

    evaluator = PolicyEvaluator(start_dir, judged, probe, k=8)
    pending = evaluator.submit(model, generator_seed=0)   # concurrent.futures.Future
    pending.result()   # {"accuracy", "n", "kinds"}
    evaluator.close()
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from typing import Any

# the child's state: (model, tokenizer, judged split, probe prompts, k), set by _start
_CHILD: dict[str, Any] = {}


def _start(start_dir: str, judged: list[dict], probe: list[dict], k: int) -> None:
    """The child's initializer: one torch thread, quiet transformers, the model built once."""
    import torch
    from sara_trainer.policy import load_policy
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(1)   # the run's trainer and worker hold the other core
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    model, tokenizer = load_policy(start_dir)
    _CHILD.update(model=model, tokenizer=tokenizer, judged=judged, probe=probe, k=k)


def _evaluate(state: dict[str, Any], generator_seed: int) -> dict[str, Any]:
    """Greedy accuracy on the judged split and the probe's group kinds under `state`."""
    import torch

    from .evaluate import greedy_accuracy, group_kinds

    model, tokenizer = _CHILD["model"], _CHILD["tokenizer"]
    model.load_state_dict(state)
    acc = greedy_accuracy(model, tokenizer, _CHILD["judged"])
    generator = torch.Generator().manual_seed(generator_seed)
    kinds = group_kinds(model, tokenizer, _CHILD["probe"], k=_CHILD["k"], generator=generator)
    return {"accuracy": acc["accuracy"], "n": acc["n"], "by_bucket": acc["by_bucket"],
            "counts": acc["counts"], "kinds": kinds}


class PolicyEvaluator:
    """Evaluate copies of a policy's weights in one child process, in submission order."""

    def __init__(self, start_dir: str, judged: list[dict], probe: list[dict], k: int) -> None:
        self._pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=multiprocessing.get_context("spawn"),
            initializer=_start, initargs=(str(start_dir), judged, probe, k))

    def submit(self, model: Any, generator_seed: int) -> concurrent.futures.Future:
        """Evaluate `model`'s weights as they are now (copied before this returns); the future
        gives ``{"accuracy", "n", "by_bucket", "counts", "kinds"}`` (accuracy and problems per
        bucket of the judged split; kinds per probe prompt in its order)."""
        state = {name: tensor.detach().to("cpu", copy=True)
                 for name, tensor in model.state_dict().items()}
        return self._pool.submit(_evaluate, state, generator_seed)

    def close(self) -> None:
        """Stop the child; evaluations not started yet are cancelled."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> PolicyEvaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
