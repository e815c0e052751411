"""PPO's critic (`sara_trainer.critic`, `sara_trainer.ppo`): GAE and the clipped value loss against
naive per-token loops, whitening, the running return normaliser, the value model's alignment, its
checkpointing, and `advantage_estimator="gae"` in the trainer against the in-process scheduler."""

from __future__ import annotations

import itertools
import json
import math

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from sara_trainer.critic import (  # noqa: E402
    ValueModel, ValueNormalizer, explained_variance, gae, outcome_rewards, value_loss, whiten)

TOL = {"rtol": 1e-5, "atol": 1e-6}


def _ragged_mask(lengths: list[int], width: int) -> torch.Tensor:
    return torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])


def _naive_gae(rewards, values, mask, gamma, lam):
    """A_t = sum_l (gamma lam)^l delta_{t+l} over the row's real tokens, V after the last = 0."""
    adv = torch.zeros_like(values, dtype=torch.float64)
    for b in range(values.shape[0]):
        n = int(mask[b].sum())
        v = [float(values[b, t]) for t in range(n)] + [0.0]
        deltas = [float(rewards[b, t]) + gamma * v[t + 1] - v[t] for t in range(n)]
        for t in range(n):
            adv[b, t] = sum((gamma * lam) ** i * deltas[t + i] for i in range(n - t))
    returns = adv + values.double() * mask.double()
    return adv, returns


# --- config -------------------------------------------------------------------------------------


def test_ppo_config_fields_validate_and_round_trip():
    from sara_trainer.config import TrainerConfig

    cfg = TrainerConfig(advantage_estimator="gae", gamma=0.99, gae_lambda=1.0, critic_lr=3e-4,
                        value_clip_eps=0.0, normalize_values=False, whiten_advantages=False,
                        critic_warmup_steps=5)
    assert TrainerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    old = {k: v for k, v in cfg.to_dict().items()      # a checkpoint from before PPO
           if k not in ("gamma", "gae_lambda", "critic_lr", "value_clip_eps", "normalize_values",
                        "whiten_advantages", "critic_warmup_steps")}
    again = TrainerConfig.from_dict(old | {"advantage_estimator": "grpo"})
    assert (again.gamma, again.gae_lambda, again.critic_lr, again.critic_warmup_steps) == \
        (1.0, 0.95, 1e-4, 0)
    for bad in ({"critic_lr": 0.0}, {"gamma": 1.5}, {"gae_lambda": -0.1},
                {"value_clip_eps": -1.0}, {"critic_warmup_steps": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainerConfig(**bad)


# --- GAE ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.8), (0.99, 0.0),
                                       (0.0, 0.5)])
@pytest.mark.parametrize("lengths,width", [([5], 5), ([3, 1, 0, 6], 6), ([2, 7, 7], 9)])
def test_gae_matches_a_naive_loop(gamma, lam, lengths, width):
    gen = torch.Generator().manual_seed(len(lengths) * 31 + width)
    mask = _ragged_mask(lengths, width)
    rewards = torch.randn(len(lengths), width, generator=gen)
    values = torch.randn(len(lengths), width, generator=gen)
    rewards[mask == 0] = float("nan")       # padding may hold anything
    values[mask == 0] = float("inf")
    adv, ret = gae(rewards, values, mask, gamma, lam)
    want_adv, want_ret = _naive_gae(torch.nan_to_num(rewards) * mask,
                                    torch.where(mask > 0, values, 0.0), mask, gamma, lam)
    torch.testing.assert_close(adv.double(), want_adv, **TOL)
    torch.testing.assert_close(ret.double(), want_ret, **TOL)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)


def test_gae_with_gamma_and_lambda_one_is_outcome_minus_value():
    mask = _ragged_mask([4, 2, 0], 4)
    scores = torch.tensor([1.0, 0.0, 1.0])
    rewards = outcome_rewards(scores, mask)
    assert rewards.tolist() == [[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]]
    values = torch.tensor([[0.1, 0.4, 0.7, 0.9], [0.5, -0.2, 3.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv, (scores[:, None] - values) * mask, **TOL)
    torch.testing.assert_close(ret, scores[:, None] * mask, **TOL)


def test_outcome_rewards_on_the_last_real_token():
    mask = _ragged_mask([1, 3, 0, 2], 3)
    out = outcome_rewards(torch.tensor([2.0, -1.0, 5.0, 0.5]), mask)
    assert out.tolist() == [[2, 0, 0], [0, 0, -1], [0, 0, 0], [0, 0.5, 0]]


# --- value loss, whitening, explained variance --------------------------------------------------


def _naive_value_loss(values, old, returns, mask, eps):
    terms = []
    for b, t in itertools.product(range(values.shape[0]), range(values.shape[1])):
        if mask[b, t] == 0:
            continue
        v, o, r = (float(x[b, t].detach()) for x in (values, old, returns))
        clipped = o + min(max(v - o, -eps), eps)
        terms.append(0.5 * max((v - r) ** 2, (clipped - r) ** 2) if eps else 0.5 * (v - r) ** 2)
    return sum(terms) / len(terms), terms


@pytest.mark.parametrize("eps", [0.2, 0.05, 0.0])
def test_value_loss_matches_a_naive_loop(eps):
    gen = torch.Generator().manual_seed(7)
    mask = _ragged_mask([4, 2, 3], 4)
    values = torch.randn(3, 4, generator=gen)
    old = values + 0.3 * torch.randn(3, 4, generator=gen)
    returns = torch.randn(3, 4, generator=gen)
    want, _ = _naive_value_loss(values, old, returns, mask, eps)
    values[mask == 0], old[mask == 0], returns[mask == 0] = float("nan"), float("inf"), 1e30
    values.requires_grad_(True)
    loss, m = value_loss(values, old, returns, mask, eps)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5)
    assert m["vf_loss"] == pytest.approx(want, rel=1e-5)
    loss.backward()
    assert torch.all(values.grad[mask == 0] == 0) and torch.isfinite(values.grad).all()
    if eps == 0.0:
        assert m["vf_clip_frac"] == 0.0


def test_value_loss_clipping_active_and_inactive():
    mask = torch.ones(1, 2)
    old, returns = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 1.0]])
    # token 0 moved inside the clip range (both branches equal); token 1 moved past it
    values = torch.tensor([[0.1, 0.5]], requires_grad=True)
    loss, m = value_loss(values, old, returns, mask, clip_eps=0.2)
    # token 1: V - R = -0.5, clipped V = 0.2 so (0.2 - 1)^2 = 0.64 > 0.25: clipped branch active
    assert float(loss.detach()) == pytest.approx(0.5 * (0.81 + 0.64) / 2)
    assert m["vf_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    # the active clipped branch is flat in V: no gradient for token 1
    assert values.grad[0, 1] == 0 and values.grad[0, 0] == pytest.approx(0.5 * (0.1 - 1.0))
    values = torch.tensor([[0.1, 0.15]], requires_grad=True)
    loss, m = value_loss(values, old, returns, mask, clip_eps=0.2)
    assert m["vf_clip_frac"] == 0.0
    assert float(loss.detach()) == pytest.approx(0.5 * (0.81 + 0.7225) / 2)


def test_value_loss_uses_the_policy_aggregations():
    mask = _ragged_mask([3, 1], 3)
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    zeros = torch.zeros_like(values)
    tokens, _ = value_loss(values, values, zeros, mask, None, aggregation="token-mean",
                           normalizer=8.0)
    seq, _ = value_loss(values, values, zeros, mask, None, aggregation="seq-mean-token-mean")
    assert float(tokens) == pytest.approx(0.5 * (1 + 4 + 9 + 16) / 8)
    assert float(seq) == pytest.approx(0.5 * ((1 + 4 + 9) / 3 + 16) / 2)


def test_whiten_and_explained_variance_over_the_mask():
    gen = torch.Generator().manual_seed(3)
    mask = _ragged_mask([5, 2, 4], 5)
    x = 3.0 + 2.0 * torch.randn(3, 5, generator=gen)
    x[mask == 0] = float("nan")
    w = whiten(x, mask)
    real = w[mask > 0].double().numpy()
    assert real.mean() == pytest.approx(0.0, abs=1e-6)
    assert real.std(ddof=1) == pytest.approx(1.0, rel=1e-5)
    assert torch.all(w[mask == 0] == 0)
    returns = torch.where(mask > 0, x, 0.0)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    mean = float(returns[mask > 0].mean())
    assert explained_variance(torch.full_like(x, mean), returns, mask) == pytest.approx(0.0,
                                                                                      abs=1e-6)
    assert math.isnan(explained_variance(x, torch.ones_like(x), mask))


# --- the return normaliser ----------------------------------------------------------------------


def test_normalizer_merge_equals_numpy_over_all_data_and_round_trips():
    gen = torch.Generator().manual_seed(11)
    norm, seen = ValueNormalizer(), []
    x = torch.tensor([[0.5, -2.0]])
    assert torch.equal(norm.normalize(x), x) and torch.equal(norm.denormalize(x), x)
    for lengths, scale in (([3, 1], 1.0), ([4, 4, 2], 5.0), ([1], 0.1), ([0, 2], 2.0)):
        mask = _ragged_mask(lengths, 4)
        values = scale * torch.randn(len(lengths), 4, generator=gen) + scale
        norm.update(values, mask)
        seen.extend(values[mask > 0].tolist())
        data = np.array(seen)
        assert norm.count == len(seen)
        assert norm.mean == pytest.approx(data.mean(), rel=1e-9, abs=1e-12)
        assert norm.var == pytest.approx(data.var(), rel=1e-9)
    y = torch.randn(2, 4, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(norm.denormalize(norm.normalize(y)), y)
    torch.testing.assert_close(norm.normalize(y), (y - data.mean()) / data.std())
    again = ValueNormalizer()
    again.load_state_dict(json.loads(json.dumps(norm.state_dict())))
    assert again.state_dict() == norm.state_dict()
    off = ValueNormalizer(enabled=False)
    off.update(torch.randn(5, generator=gen))
    assert off.count == 0 and torch.equal(off.normalize(y), y)


# --- the value model ----------------------------------------------------------------------------


def test_value_at_index_j_sees_only_tokens_before_completion_token_j(tiny_dir):
    from sara_trainer.policy import make_batch

    model = ValueModel.from_policy(tiny_dir)
    torch.nn.init.normal_(model.head.weight, std=0.1)
    prompts, completion = [[5, 6, 7], [8, 9]], [10, 11, 12, 13, 14]
    base = model(make_batch(prompts, [completion, completion[:3]], 0))
    assert base.shape == (2, 5) and torch.all(base[1, 3:] == 0)
    for j in range(len(completion)):
        changed = list(completion)
        changed[j] = 20
        values = model(make_batch(prompts, [changed, completion[:3]], 0))
        torch.testing.assert_close(values[:, :j + 1], base[:, :j + 1], rtol=0, atol=1e-6)
        if j + 1 < len(completion):
            assert not torch.allclose(values[0, j + 1:], base[0, j + 1:])
        torch.testing.assert_close(values[1], base[1], rtol=0, atol=1e-6)  # other row untouched


def test_value_model_save_load_round_trip_beside_a_loadable_policy(tiny_dir, tmp_path):
    from sara_trainer.checkpoint import save_checkpoint
    from sara_trainer.config import TrainerConfig
    from sara_trainer.policy import load_policy, make_batch
    from sara_trainer.ppo import PPOCritic
    from transformers import AutoModelForCausalLM

    critic = PPOCritic(TrainerConfig(model=str(tiny_dir), advantage_estimator="gae"),
                       ValueModel.from_policy(tiny_dir))
    torch.nn.init.normal_(critic.model.head.weight, std=0.1)
    critic.model.normalizer.update(torch.tensor([0.0, 1.0, 1.0, 3.0]))
    batch = make_batch([[5, 6]], [[7, 8, 9]], 0)
    critic.model(batch).sum().backward()
    critic.optimizer.step()
    policy, tokenizer = load_policy(tiny_dir)
    path = save_checkpoint(tmp_path / "ck", policy, tokenizer, step=1,
                           extra_writers=[critic.write])
    again = PPOCritic.create(critic.config, path)
    torch.testing.assert_close(again.model(batch), critic.model(batch), rtol=0, atol=0)
    assert again.model.normalizer.state_dict() == critic.model.normalizer.state_dict()
    assert again.optimizer.state_dict()["state"], "the critic's AdamW state comes back"
    loaded = AutoModelForCausalLM.from_pretrained(path)        # what a worker loads
    assert type(loaded).__name__ == "GPT2LMHeadModel"
    torch.testing.assert_close(loaded.state_dict()["lm_head.weight"],
                               policy.state_dict()["lm_head.weight"])


def test_a_failing_extra_writer_leaves_no_checkpoint(tiny, tmp_path):
    from sara_trainer.checkpoint import latest_checkpoint, save_checkpoint

    def boom(directory):
        (directory / "critic").mkdir()
        raise OSError("disk full")

    with pytest.raises(OSError):
        save_checkpoint(tmp_path / "ck", *tiny, step=1, extra_writers=[boom])
    assert latest_checkpoint(tmp_path / "ck") is None
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name != "latest"]


# --- the trainer with advantage_estimator="gae" -------------------------------------------------


@pytest.fixture()
def scheduler(tmp_path):
    pytest.importorskip("sara_service")
    from tests.trainer.test_loop import ScriptedWorker, _local, _prompts

    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        ScriptedWorker(sara).fill()
        yield sara


def test_gae_trainer_steps_checkpoint_and_resume_with_the_critic(tiny_dir, tmp_path, scheduler):
    from sara_trainer.checkpoint import latest_checkpoint
    from sara_trainer.loop import Trainer
    from tests.trainer.test_loop import ScriptedWorker, _config

    cfg = _config(tiny_dir, tmp_path, advantage_estimator="gae", critic_lr=1e-3,
                  critic_warmup_steps=1)
    trainer = Trainer(scheduler, cfg)
    policy_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    first = trainer.train_on(trainer.next_batch(timeout_s=5))
    m = first.metrics
    assert m["policy_frozen"] == 1.0 and "pg_loss" not in m            # critic warm-up step
    assert all(torch.equal(policy_before[k], v) for k, v in trainer.model.state_dict().items())
    assert m["value_mean"] == 0.0                  # the zero head's first values
    assert all(math.isfinite(m[k]) for k in ("vf_loss", "critic_grad_norm", "return_mean"))
    second = trainer.train_on(trainer.next_batch(timeout_s=5), last=True)
    m = second.metrics
    assert "policy_frozen" not in m and math.isfinite(second.loss) and not second.skipped
    assert m["adv_mean"] == pytest.approx(0.0, abs=1e-5)    # whitened over the batch's tokens
    assert m["value_mean"] != 0.0 and math.isfinite(m["explained_variance"])
    assert any(not torch.equal(policy_before[k], v) for k, v in trainer.model.state_dict().items())

    path = latest_checkpoint(cfg.checkpoint_dir)
    assert (path / "critic" / "value_head.safetensors").is_file()
    ScriptedWorker(scheduler).fill()
    resumed = Trainer(scheduler, cfg.replace(max_steps=3))
    assert resumed.step == 2
    assert resumed.critic.model.normalizer.state_dict() == \
        trainer.critic.model.normalizer.state_dict()
    for (name, a), b in zip(resumed.critic.model.state_dict().items(),
                            trainer.critic.model.state_dict().values()):
        assert torch.equal(a, b), name
    [third] = resumed.run(timeout_s=5)
    assert third.step == 3 and math.isfinite(third.loss)


def test_critic_steps_reduce_the_value_loss_on_a_repeated_batch(tiny_dir, tmp_path, scheduler):
    from sara_trainer.loop import Trainer
    from sara_trainer.policy import make_batch
    from tests.trainer.test_loop import _config

    cfg = _config(tiny_dir, tmp_path, advantage_estimator="gae", critic_lr=1e-3,
                  micro_batch_rollouts=3, value_clip_eps=0.0)
    trainer = Trainer(scheduler, cfg)
    batch = trainer.next_batch(timeout_s=5)
    rows = trainer.updater.rows(batch.groups)
    chunks = [range(s, min(s + 3, len(rows.rewards))) for s in range(0, len(rows.rewards), 3)]
    pad = trainer.tokenizer.pad_token_id
    batches = [make_batch([rows.prompt_ids[i] for i in c], [rows.completion_ids[i] for i in c],
                          pad) for c in chunks]
    scores = [torch.tensor([rows.rewards[i] for i in c]) for c in chunks]
    data = trainer.critic.targets(batches, scores)
    assert sum(a.shape[0] for a in data.advantages) == len(rows.rewards)
    losses = [trainer.critic.fit(batches, data)["vf_loss"] for _ in range(8)]
    assert all(math.isfinite(x) for x in losses)
    # measured: 0.50 -> 0.25 over 8 steps (normalised targets: the zero head starts at 0.5)
    assert losses[0] == pytest.approx(0.5, rel=1e-3)
    assert losses[-1] < 0.7 * losses[0], losses
