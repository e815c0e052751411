"""The trainer loop (`sara_trainer.loop`) against the real scheduler in-process
(`sara_client.local()`), fed by a scripted worker: hand-made rewards (each group's first rollout
right, its second wrong, so every group commits after two), completions either as text (the
trainer re-tokenises them) or sampled by the tiny model with token ids and behaviour logprobs.

Everything runs on one thread: the script fills the scheduler's prefetch, then the trainer takes
the batches; no sleeps, no races.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("sara_service")

import sara_client  # noqa: E402
import torch  # noqa: E402
from sara_demo.tasks.arith import make_split, target_completion  # noqa: E402
from sara_trainer.checkpoint import latest_checkpoint, read_trainer_state  # noqa: E402
from sara_trainer.config import TrainerConfig  # noqa: E402
from sara_trainer.loop import Trainer  # noqa: E402
from sara_trainer.policy import load_policy, sample  # noqa: E402
from sara_trainer.updating import Updater  # noqa: E402

K, BATCH, PREFETCH = 4, 2, 2


class ScriptedWorker:
    """Leases rollouts and answers them with scripted rewards; optionally real sampled tokens."""

    def __init__(self, sara, model=None, tokenizer=None) -> None:
        self.sara, self.model, self.tokenizer = sara, model, tokenizer
        self.seen: dict[str, int] = defaultdict(int)   # group id -> results sent
        self.generator = torch.Generator().manual_seed(0)

    def answer(self, rollout, version: int) -> dict:
        n = self.seen[rollout.group_id]
        self.seen[rollout.group_id] += 1
        right = n % 2 == 0                                   # right, wrong, right, wrong
        result = {"rollout_id": rollout.rollout_id, "reward": float(right),
                  "policy_version": version}
        if self.model is None:
            text = target_completion(rollout.prompt) if right else "x"
            result.update(completion=text, completion_tokens=len(text))
        else:
            s = sample(self.model, self.tokenizer, [rollout.prompt], k=1, max_new_tokens=6,
                       generator=self.generator)
            result.update(completion=s.completions[0], completion_tokens=len(s.token_ids[0]),
                          token_ids=s.token_ids[0], logprobs=s.logprobs[0],
                          finish_reason=s.finish_reasons[0])
        return result

    def fill(self, max_rounds: int = 200) -> None:
        """Work until the scheduler stops handing out rollouts (its prefetch is full)."""
        for _ in range(max_rounds):
            lease = self.sara.lease("scripted", max_rollouts=64)
            if not lease.rollouts:
                return
            self.sara.report("scripted", [self.answer(r, lease.policy.version)
                                          for r in lease.rollouts])
        raise AssertionError("the scheduler never stopped issuing rollouts")


def _prompts(n: int = 40) -> list[dict]:
    return make_split(n, seed=3, buckets=["add1", "add2"])


def _config(tiny_dir, tmp_path, **over) -> TrainerConfig:
    base = dict(model=str(tiny_dir), checkpoint_dir=str(tmp_path / "ckpt"),
                lr=1e-3, checkpoint_every=1,
                keep_checkpoints=2, batch_wait_s=0.0, threads=2, max_steps=2)
    base.update(over)
    return TrainerConfig(**base)


def _local(tmp_path):
    return sara_client.local(data_dir=tmp_path / "redis", redis_url=None, group_size=K,
                             batch_size=BATCH, prefetch_batches=PREFETCH, max_tokens=6,
                             max_staleness=4)


def route_client_to(monkeypatch, sara, expect: tuple[str, str | None] | None = None) -> None:
    """`SaraClient(url, token=...)` opened by `sara train` gives the in-process scheduler's
    client instead; with `expect`, the (url, token) it was opened with must be that."""

    class ToLocal:
        def __init__(self, url, token=None):
            if expect is not None:
                assert (url, token) == expect

        def __enter__(self):
            return sara

        def __exit__(self, *exc_info):
            return None

    monkeypatch.setattr(sara_client, "SaraClient", ToLocal)


def _check_checkpoint(root, step: int, version: int) -> None:
    path = latest_checkpoint(root)
    assert path is not None and path.name == f"step-{step:06d}"
    state = read_trainer_state(path)
    assert (state["step"], state["policy_version"]) == (step, version)
    assert (path / "model.safetensors").is_file()
    model, tokenizer = load_policy(path)            # what a worker loads
    assert tokenizer("1+2=")["input_ids"] and model.config.n_positions > 0


def test_trainer_steps_ack_checkpoint_publish_and_resume(tiny_dir, tmp_path):
    cfg = _config(tiny_dir, tmp_path)
    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        worker = ScriptedWorker(sara)
        worker.fill()

        trainer = Trainer(sara, cfg)
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        reports = trainer.run(timeout_s=5)
        assert [r.step for r in reports] == [1, 2]
        assert [r.policy_version for r in reports] == [1, 2]
        assert all(math.isfinite(r.loss) and not r.skipped for r in reports)
        assert all(r.groups == BATCH and r.rollouts == BATCH * K for r in reports)
        assert reports[0].metrics["off_policy"] == 0.0  # text only: on-policy, ratio 1
        # each step names its groups' prompts and mean rewards (right, wrong, right, wrong)
        known = {p["id"] for p in _prompts()}
        assert all(len(r.prompt_ids) == BATCH and set(r.prompt_ids) <= known for r in reports)
        assert all(r.group_mean_rewards == [0.5] * BATCH for r in reports)
        assert trainer.acked == [r.batch_id for r in reports]
        changed = any(not torch.equal(before[k], v) for k, v in
                      trainer.model.state_dict().items())
        assert changed
        policy = sara.get_policy()
        assert policy.version == 2 and policy.checkpoint == reports[-1].checkpoint
        _check_checkpoint(cfg.checkpoint_dir, 2, 2)
        assert sara.stats().counters.batches_acked == 2

        # a new trainer on the same checkpoint dir resumes at step 2 / v2 and trains to 4
        worker.fill()
        resumed = Trainer(sara, cfg.replace(max_steps=4))
        assert (resumed.step, resumed.version) == (2, 2)
        assert torch.equal(next(iter(resumed.model.state_dict().values())),
                           next(iter(trainer.model.state_dict().values())))
        assert resumed.optimizer.state, "optimizer state comes back with the checkpoint"
        more = resumed.run(timeout_s=5)
        assert [(r.step, r.policy_version) for r in more] == [(3, 3), (4, 4)]
        assert sara.get_policy().version == 4
        _check_checkpoint(cfg.checkpoint_dir, 4, 4)
        stats = sara.stats()
        assert stats.counters.batches_acked == 4
        assert stats.queues.unacked_batches == 0
    kept = sorted(p.name for p in (tmp_path / "ckpt").glob("step-*"))
    assert kept == ["step-000003", "step-000004"]  # keep_checkpoints=2


def test_batch_size_hook_chooses_each_steps_request(tiny_dir, tmp_path):
    asked = []

    def size():
        asked.append(len(asked) + 1)
        return asked[-1]          # one group for the first step, two for the second

    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        ScriptedWorker(sara).fill()
        trainer = Trainer(sara, _config(tiny_dir, tmp_path), batch_size=size)
        reports = trainer.run(timeout_s=5)
    assert [r.groups for r in reports] == [1, 2] and asked == [1, 2]


def test_behaviour_logprobs_kl_and_estimators(tiny_dir, tmp_path):
    model, tokenizer = load_policy(tiny_dir)
    cfg = _config(tiny_dir, tmp_path, kl_coef=0.1, advantage_estimator="rloo",
                  micro_batch_rollouts=3, max_steps=1)
    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        ScriptedWorker(sara, model, tokenizer).fill()
        trainer = Trainer(sara, cfg)
        assert trainer.reference is not None
        [report] = trainer.run(timeout_s=5)
    m = report.metrics
    assert m["off_policy"] == 1.0                      # used the rollouts' logprobs
    # sampled by the very weights being trained: the ratio starts at 1, KL to the reference 0
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["kl"] == pytest.approx(0.0, abs=1e-6)
    assert math.isfinite(report.loss) and report.tokens > 0
    state = json.loads((latest_checkpoint(cfg.checkpoint_dir) / "trainer_state.json").read_text())
    assert state["config"]["advantage_estimator"] == "rloo"
    assert state["extra"]["trained_batches"] == [report.batch_id]


def test_the_sampling_comes_with_the_batch_from_the_scheduler(tiny_dir, tmp_path, monkeypatch):
    """The scheduler's temperature and max_tokens are the only ones: the batch carries them, and
    at temperature 0.5 the workers' raw (temperature 1) logprobs are not the ratio's
    denominator, where at 1 they are (test above)."""
    model, tokenizer = load_policy(tiny_dir)
    seen = []
    update = Updater.update
    monkeypatch.setattr(Updater, "update",
                        lambda self, groups, sampling=None, step=0: seen.append(sampling) or
                        update(self, groups, sampling, step))
    with sara_client.local(data_dir=tmp_path / "redis", redis_url=None, group_size=K,
                           batch_size=BATCH, prefetch_batches=PREFETCH, max_tokens=5,
                           temperature=0.5, max_staleness=4) as sara:
        sara.add_prompts(_prompts())
        ScriptedWorker(sara, model, tokenizer).fill()
        [report] = Trainer(sara, _config(tiny_dir, tmp_path, max_steps=1)).run(timeout_s=5)
    assert [(s.temperature, s.max_tokens) for s in seen] == [(0.5, 5)]
    assert report.metrics["off_policy"] == 0.0


def test_redelivered_batch_already_trained_is_only_acked(tiny_dir, tmp_path, caplog):
    cfg = _config(tiny_dir, tmp_path, max_steps=1)
    caplog.set_level("INFO", logger="sara.trainer")
    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        ScriptedWorker(sara).fill()
        trainer = Trainer(sara, cfg)
        batch = trainer.next_batch(timeout_s=5)
        assert batch is not None
        trainer.train_on(batch, last=True)
        # a restarted trainer receiving the same batch again acks it without a second update
        again = Trainer(sara, cfg.replace(max_steps=5))
        assert again.train_on(batch) is None
        assert (again.step, again.acked) == (1, [batch.batch_id])
    # the step line and the ack-only warning carry the batch id as a field (JSON logs)
    tagged = [r for r in caplog.records if getattr(r, "batch_id", None) == batch.batch_id]
    assert {r.levelname for r in tagged} == {"INFO", "WARNING"}


# --- `sara train` ------------------------------------------------------------------------------


def test_sara_train_cli_trains_against_the_scheduler(tiny_dir, tmp_path, monkeypatch):
    from sara_cli import main as cli
    from typer.testing import CliRunner

    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        ScriptedWorker(sara).fill()

        route_client_to(monkeypatch, sara, expect=("http://scheduler:9", "t0k"))
        result = CliRunner().invoke(cli.app, [
            "train", "--model", str(tiny_dir), "--url", "http://scheduler:9", "--token", "t0k",
            "--checkpoint-dir", str(tmp_path / "ck"), "--steps", "2", "--estimator", "dr_grpo",
            "--lr", "1e-3", "--kl-coef", "0.05", "--seed", "1", "--threads", "1",
            "--set", "gae_lambda=0.9", "--set", "normalize_values=false"])
        assert result.exit_code == 0, result.output
        assert "trained to step 2, policy v2" in result.output
        assert sara.get_policy().version == 2
        assert sara.stats().counters.batches_acked == 2
    state = read_trainer_state(tmp_path / "ck")
    assert (state["step"], state["policy_version"]) == (2, 2)
    assert state["config"]["advantage_estimator"] == "dr_grpo"
    assert (state["config"]["kl_coef"], state["config"]["seed"]) == (0.05, 1)
    assert (state["config"]["gae_lambda"], state["config"]["normalize_values"]) == (0.9, False)


def test_sara_train_cli_rejects_bad_options(tmp_path):
    from sara_cli import main as cli
    from typer.testing import CliRunner

    result = CliRunner().invoke(cli.app, ["train", "--model", str(tmp_path), "--estimator",
                                          "ppo-ish"])
    assert result.exit_code == 2 and "advantage_estimator must be one of" in result.output
    result = CliRunner().invoke(cli.app, ["train"])
    assert result.exit_code == 2 and "--model" in result.output
    result = CliRunner().invoke(cli.app, ["train", "--model", str(tmp_path), "--set", "nope=1"])
    assert result.exit_code == 2 and "unknown TrainerConfig fields: nope" in result.output
    result = CliRunner().invoke(cli.app, ["train", "--model", str(tmp_path), "--set", "lr"])
    assert result.exit_code == 2 and "--set wants KEY=VALUE" in result.output
    result = CliRunner().invoke(cli.app, ["train", "--model", str(tmp_path), "--set",
                                          "critic_lr=0"])
    assert result.exit_code == 2 and "critic_lr must be > 0" in result.output
