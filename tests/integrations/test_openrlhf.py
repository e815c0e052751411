"""SARA batches through OpenRLHF's own objects at the recipe's touch point (docs/integration.md,
section 8), checked against OpenRLHF 0.11.2: ``SaraSamplesGenerator.generate_samples`` (the
drop-in for ``PPOTrainer.samples_generator``) returns real ``Experience`` objects built from a
real SARA batch (the real app on the tests' real Redis), which OpenRLHF's own
``Experience.concat_experiences`` (what ``RemoteExperienceMaker.split_rollout_samples`` does)
and ``split_experience_batch`` handle, groups contiguous for ``group_norm``; where OpenRLHF's
``SamplesGenerator`` itself imports (it needs ray and vllm), the Experiences equal the ones its
``_process_response_into_experience`` makes from the same responses.

Skipped where OpenRLHF does not import. ``pip install openrlhf`` cannot complete on a CPU-only
box (it pins flash-attn==2.8.3, whose build needs a CUDA torch); CI installs the package with
``--no-deps`` (.ci/run), which is enough for ``Experience``."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sara_service")
try:
    from openrlhf.trainer.ppo_utils.experience import Experience, split_experience_batch
except Exception as exc:  # noqa: BLE001 - ImportError, or a dependency's own import error
    pytest.skip(f"OpenRLHF is not importable here: {type(exc).__name__}: {exc}",
                allow_module_level=True)

from sara_integrations import openrlhf as glue  # noqa: E402

from .conftest import K  # noqa: E402
from ._drive import encode, fake_generate, next_batch  # noqa: E402


def test_generate_samples_returns_openrlhf_experiences(sara):
    rng = random.Random(7)
    gen = glue.SaraSamplesGenerator(
        sara, lambda rollouts, kw: fake_generate(rollouts, rng, sara.get_policy().version),
        encode, groups_per_step=2)
    exps, rate, groups, exhausted = gen.generate_samples(max_len=64, n_samples_per_prompt=K)
    assert all(isinstance(e, Experience) for e in exps)
    assert (len(exps), rate, groups, exhausted) == (2 * K, None, 2, False)
    # what RemoteExperienceMaker.split_rollout_samples does with them
    for i, e in enumerate(exps):
        e.index = [i]
    merged = Experience.concat_experiences(exps, 0)
    assert merged.sequences.shape[0] == 2 * K
    assert merged.rewards.tolist() == [float(e.rewards) for e in exps]
    # compute_advantages_and_returns: rewards.reshape(-1, n_samples_per_prompt) -> SARA's groups
    by_group = merged.rewards.reshape(-1, K)
    assert (by_group.std(-1) > 0).all()
    norm = (by_group - by_group.mean(-1, keepdim=True)) / (by_group.std(-1, keepdim=True) + 1e-9)
    assert (norm.abs().sum(-1) > 0).all()
    again = split_experience_batch(merged)
    assert len(again) == 2 * K
    assert all(torch.equal(a.sequences.reshape(-1), merged.sequences[i])
               for i, a in enumerate(again))
    gen.generate_samples(max_len=64)
    assert gen.batches_acked == 1


def test_experiences_match_openrlhfs_own_builder(sara):
    try:
        from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"OpenRLHF's SamplesGenerator needs ray and vllm: {exc}")
    batch = next_batch(sara, size=2, seed=9)
    for response in glue.batch_responses(batch, encode):
        theirs = SamplesGenerator._process_response_into_experience(None, response, max_len=64)
        ours = glue.experience_from_response(response, Experience, max_len=64)
        for name in ("sequences", "attention_mask", "action_mask", "rollout_log_probs",
                     "rewards", "scores", "response_length", "truncated", "total_length"):
            assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
        assert (ours.prompts, ours.labels) == (theirs.prompts, theirs.labels)


def test_a_group_of_another_size_than_n_samples_per_prompt_is_refused_not_reshaped(sara):
    """OpenRLHF reshapes rewards into rows of n_samples_per_prompt: a group of any other size
    (commit=partial, Reinforce-Ada's kept rollouts) would be normalised across prompts."""
    rng = random.Random(7)
    gen = glue.SaraSamplesGenerator(
        sara, lambda rollouts, kw: fake_generate(rollouts, rng, sara.get_policy().version),
        encode, groups_per_step=2, samples_per_prompt=K + 1)
    with pytest.raises(ValueError, match=rf"holds {K} rollouts, not n_samples_per_prompt={K + 1}"):
        gen.generate_samples(max_len=64)
    assert gen.pending_batch_id is None      # nothing will be acked as trained
    # the generate kwarg OpenRLHF passes is checked the same way
    gen.samples_per_prompt = None
    with pytest.raises(ValueError, match="commit=complete"):
        gen.generate_samples(max_len=64, n_samples_per_prompt=K - 1)


@pytest.fixture
def sara_partial(redis_url):
    """Groups delivered as they stand once mixed (commit=partial): 2 to K rollouts each."""
    from sara_client import local

    from ._drive import PROMPTS

    with local(redis_url=redis_url, group_size=K, batch_size=4, tau_low=0.5,
               commit="partial") as client:
        client.add_prompts(PROMPTS)
        yield client


def naive_advantages(rewards, estimator):
    """The textbook formulas, one group at a time, in plain Python."""
    n, total = len(rewards), sum(rewards)
    mean = total / n
    if estimator == "rloo":
        return [r - (total - r) / (n - 1) for r in rewards]
    if estimator == "dr_grpo":
        return [r - mean for r in rewards]
    std = (sum((r - mean) ** 2 for r in rewards) / (n - 1)) ** 0.5
    return [(r - mean) / (std + 1e-9) for r in rewards]


def unequal_batch(sara):
    for seed in range(20):
        batch = next_batch(sara, size=4, seed=seed)
        if len({len(g.rollouts) for g in batch.groups}) > 1:
            return batch
        sara.ack(batch.batch_id)
    raise AssertionError("commit=partial delivered only groups of one size in 20 batches")


@pytest.mark.parametrize("estimator", glue.GROUP_ESTIMATORS)
def test_groups_of_unequal_size_get_advantages_over_their_own_rollouts(sara_partial, estimator):
    batch = unequal_batch(sara_partial)
    responses = glue.batch_responses(batch, encode, group_estimator=estimator)
    at = 0
    for group in batch.groups:
        rewards = [r.reward for r in group.rollouts]
        mine = responses[at:at + len(rewards)]
        at += len(rewards)
        assert [r["scores"] for r in mine] == rewards          # raw rewards, for logging
        assert [r["sara_group_id"] for r in mine] == [group.group_id] * len(rewards)
        assert [r["reward"] for r in mine] == pytest.approx(naive_advantages(rewards, estimator))
    assert at == len(responses)
    # OpenRLHF's flash_reinforce with n_samples_per_prompt 1: reshape(-1, 1), minus the batch
    # mean, no whitening: the batch mean is zero, so the advantages reach the loss unchanged
    exps = glue.batch_to_experiences(batch, encode, Experience, 64, group_estimator=estimator)
    rewards = torch.cat([e.rewards for e in exps]).to(torch.float32).reshape(-1, 1)
    flash = (rewards - rewards.mean()).reshape(-1)
    assert flash.tolist() == pytest.approx([r["reward"] for r in responses], abs=1e-6)


def test_the_group_estimator_runs_with_one_sample_a_prompt_and_takes_any_group_size(
        sara_partial):
    rng = random.Random(3)
    gen = glue.SaraSamplesGenerator(
        sara_partial,
        lambda rollouts, kw: fake_generate(rollouts, rng, sara_partial.get_policy().version),
        encode, groups_per_step=4, group_estimator="group_norm")
    with pytest.raises(ValueError, match="n_samples_per_prompt 1 and --algo.advantage.estimator "
                                         "flash_reinforce"):
        gen.generate_samples(max_len=64, n_samples_per_prompt=K)
    assert gen.pending_batch_id is None
    sizes = []
    for _ in range(6):
        exps, _, groups, _ = gen.generate_samples(max_len=64, n_samples_per_prompt=1)
        assert groups == 4 and abs(float(sum(e.rewards.sum() for e in exps))) < 1e-6
        assert {float(e.scores) for e in exps} == {0.0, 1.0}
        sizes.append(len(exps))
    assert any(n != 4 * K for n in sizes), sizes   # some batch held a group of another size than K
    with pytest.raises(ValueError, match="group_estimator must be one of"):
        glue.SaraSamplesGenerator(sara_partial, fake_generate, encode, groups_per_step=1,
                                  group_estimator="reinforce_baseline")
