"""The TRL adapter through the real library: examples/trl_grpo.py trains two GRPOTrainer steps
on SARA's mixed groups with a tiny local GPT-2 on CPU. Skipped where TRL is not installed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


def test_trl_grpo_trainer_trains_on_sara_batches(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    history = module.main(steps=2, out_dir=str(tmp_path))
    steps = [h for h in history if "loss" in h]
    assert len(steps) == 2
    # SARA delivers only mixed groups: every step has a non-zero advantage, so a gradient
    assert all(math.isfinite(h["grad_norm"]) and h["grad_norm"] > 0 for h in steps)
    assert "2 batches acked" in capsys.readouterr().out


def test_group_advantages_are_normalised_per_group():
    import torch

    from sara_integrations.trl import _group_advantages

    adv = _group_advantages(torch.tensor([0.0, 1.0, 1.0, 1.0, 0.0, 0.0]), [2, 4])
    assert adv[:2].sum().abs() < 1e-5 and adv[2:].sum().abs() < 1e-5
    assert adv[0] < 0 < adv[1]


@pytest.mark.parametrize("version", ["1.15.2", "1.17.0", "2.0.0"])
def test_other_trl_releases_are_refused_with_the_supported_range(version):
    from trl import GRPOTrainer

    from sara_integrations.trl import check_trl

    with pytest.raises(ImportError, match=r"supports TRL 1\.16\.x only.*found TRL "
                                          + version.replace(".", r"\.")):
        check_trl(version, GRPOTrainer)


def test_the_installed_trl_is_a_supported_one_with_the_hook():
    import trl
    from trl import GRPOTrainer

    from sara_integrations.trl import check_trl

    check_trl(trl.__version__, GRPOTrainer)
    check_trl("1.16.9", GRPOTrainer)
    with pytest.raises(ImportError, match="_generate_and_score_completions"):
        check_trl("1.16.0", object)  # a 1.16 whose trainer lost the method
