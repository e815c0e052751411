"""The update skips the passes of rows whose advantage is 0 (``skip_zero_advantage``) and takes
the same optimiser step as without the skip: the same gradient, the same loss, and the same step
when every row of a batch is saturated (the optimiser's momentum still moves the weights)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from sara_client.models import BatchGroup, BatchRollout  # noqa: E402
from sara_trainer.config import TrainerConfig  # noqa: E402
from sara_trainer.policy import load_policy  # noqa: E402
from sara_trainer.updating import Updater  # noqa: E402


def _group(name: str, rewards: list[float], lengths: list[int]) -> BatchGroup:
    """A group of rollouts with the given rewards and completion lengths (token ids 5..)."""
    return BatchGroup(group_id=name, prompt_id=name, prompt=f"{len(name)}+{len(rewards)}=",
                      rollouts=[BatchRollout(rollout_id=f"{name}:{i}", completion="x" * n,
                                             reward=r, completion_tokens=n, policy_version=0,
                                             token_ids=[5 + (i + j) % 7 for j in range(n)],
                                             logprobs=[-1.5] * n)
                                for i, (r, n) in enumerate(zip(rewards, lengths))])


MIXED_AND_SATURATED = [_group("mixed", [1.0, 0.0, 0.0, 1.0], [3, 5, 2, 4]),
                       _group("fail", [0.0] * 4, [6, 1, 3, 2]),
                       _group("pass", [1.0] * 4, [2, 2, 7, 3])]
ALL_SATURATED = [_group("fail2", [0.0] * 4, [4, 3, 2, 5]), _group("pass2", [1.0] * 4, [1, 2, 3, 4])]


def _updater(tiny_dir, **over) -> Updater:
    model, tokenizer = load_policy(tiny_dir)
    for module in model.modules():          # no dropout: the two runs must draw nothing
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    config = TrainerConfig(model=str(tiny_dir), lr=1e-2, micro_batch_rollouts=3, **over)
    # SGD with momentum: its step is the gradient, so equal steps mean equal gradients (Adam's
    # first step, about lr·sign(g), would blow the float rounding of a near-zero gradient up to
    # lr), and its momentum moves the weights on a step that has no gradient, as Adam's does
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
    return Updater(config, model, tokenizer, optimizer)


def _same_weights(a: Updater, b: Updater) -> bool:
    return all(torch.allclose(p, q, atol=1e-6, rtol=1e-5)
               for p, q in zip(a.model.parameters(), b.model.parameters()))


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_skipping_zero_advantage_rows_takes_the_same_steps(tiny_dir, aggregation):
    skip = _updater(tiny_dir, loss_aggregation=aggregation)
    full = _updater(tiny_dir, loss_aggregation=aggregation, skip_zero_advantage=False)
    for step, batch in enumerate([MIXED_AND_SATURATED, ALL_SATURATED, MIXED_AND_SATURATED]):
        a, b = skip.update(batch, step=step), full.update(batch, step=step)
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["tokens"] == b["tokens"] == sum(len(r.token_ids) for g in batch
                                                 for r in g.rollouts)
        # the skip did skip (a run that skipped nothing would match trivially); the full did not
        assert a["rows_without_gradient"] == (8 if batch is MIXED_AND_SATURATED else 7)
        assert b["rows_without_gradient"] == 0
        assert _same_weights(skip, full), f"weights differ after step {step}"
    before = [p.clone() for p in skip.model.parameters()]
    skip.update(ALL_SATURATED, step=3)       # no gradient, yet the momentum moves them
    assert any(not torch.equal(p, q) for p, q in zip(before, skip.model.parameters()))


def test_the_rows_skipped_are_the_saturated_ones(tiny_dir):
    updater = _updater(tiny_dir)
    assert updater.update(MIXED_AND_SATURATED)["rows_without_gradient"] == 8
    # a batch with no gradient at all still runs one row, so the step is taken as before
    assert updater.update(ALL_SATURATED, step=1)["rows_without_gradient"] == 7


def test_a_kl_term_keeps_every_row(tiny_dir):
    """Under a KL term a zero-advantage row still has a gradient: nothing is skipped."""
    model, _ = load_policy(tiny_dir)
    updater = _updater(tiny_dir, kl_coef=0.1)
    updater.reference = model.eval().requires_grad_(False)
    assert updater.update(MIXED_AND_SATURATED)["rows_without_gradient"] == 0
