"""Weights-only policy versions between full resume checkpoints, token-budget micro-batches and
gradient checkpointing through the real loop; bf16 weights-only saves."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("sara_service")

from tests._need import need  # noqa: E402

need("torch", "torch (the trainer extra; CI installs it)")

import torch  # noqa: E402
from sara_trainer.checkpoint import (OPTIMIZER_FILE, latest_checkpoint,  # noqa: E402
                                     read_trainer_state, save_checkpoint)
from sara_trainer.loop import Trainer  # noqa: E402
from sara_trainer.policy import load_policy  # noqa: E402
from sara_trainer.publishing import PUBLISHED  # noqa: E402

from tests.trainer.test_loop import ScriptedWorker, _config, _local, _prompts  # noqa: E402


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
def test_publish_every_step_full_checkpoint_every_second(tiny_dir, tmp_path, capsys):
    cfg = _config(tiny_dir, tmp_path, device="auto", checkpoint_every=2, publish_every=1,
                  max_steps=3, micro_batch_tokens=40, gradient_checkpointing=True)
    root = tmp_path / "ckpt"
    with _local(tmp_path) as sara:
        sara.add_prompts(_prompts())
        worker = ScriptedWorker(sara)
        worker.fill()
        trainer = Trainer(sara, cfg)
        assert trainer.config.device in ("cpu", "cuda")
        start = capsys.readouterr().out   # the probe's figure; the estimate needs a batch
        assert "KiB a token in rows of" in start and "memory estimate (GiB)" not in start
        assert any(getattr(m, "gradient_checkpointing", False) for m in trainer.model.modules())
        reports = trainer.run(timeout_s=5)
        worker.fill()
        reports += trainer.run(timeout_s=5)
        said = capsys.readouterr().out        # estimate and measurement, the first step only
        assert said.count("memory estimate (GiB): params") == 1
        assert said.count("memory measured over the first step") == 1
        assert [r.policy_version for r in reports] == [1, 2, 3]
        assert all(math.isfinite(r.loss) and not r.skipped for r in reports)
        published = reports[0].checkpoint
        assert published.startswith(str((root / PUBLISHED).resolve()))
        assert sara.get_policy().checkpoint == reports[-1].checkpoint
    full = sorted(p.name for p in root.glob("step-*"))
    assert full == ["step-000002", "step-000003"]          # step 1 was weights only
    assert not (root / PUBLISHED / "step-000001" / OPTIMIZER_FILE).exists()
    assert (root / "step-000002" / OPTIMIZER_FILE).is_file()
    model, _ = load_policy(published)                      # what a worker loads
    assert model.config.n_positions > 0
    assert latest_checkpoint(root).name == "step-000003"   # resume reads full ones only
    assert read_trainer_state(root)["policy_version"] == 3


def test_bf16_weights_only_save_keeps_ties(tiny, tmp_path):
    model, tokenizer = tiny
    path = save_checkpoint(tmp_path, model, tokenizer, step=1, weights_dtype=torch.bfloat16)
    assert not (path / OPTIMIZER_FILE).exists()
    loaded, _ = load_policy(path, dtype=torch.bfloat16)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name].float(),
                                   value.to(torch.bfloat16).float())
    head = loaded.get_output_embeddings().weight
    assert head.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    assert model.dtype == torch.float32                    # the trainer's copy is untouched
