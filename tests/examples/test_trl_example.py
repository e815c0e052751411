"""The TRL adapter through the real library and its public API: examples/trl_grpo.py trains two
GRPOTrainer steps on SARA's mixed groups with a tiny local GPT-2 on CPU, TRL computing the
advantages from the rewards SARA was told. Skipped where TRL is not installed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


@pytest.mark.slow  # seconds: the full suite's, not the fast tier's
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
    # TRL's own reward logging sees SARA's rewards: every group mixed, none with zero spread
    assert all(h["frac_reward_zero_std"] == 0.0 and 0 < h["rewards/sara_reward/mean"] < 1
               for h in steps)
    assert "2 batches acked" in capsys.readouterr().out


def test_the_reward_function_hands_back_what_sara_was_told():
    from sara_integrations.trl import sara_reward

    assert sara_reward(["", ""], ["a", "b"], sara_reward=[1, 0.1]) == [1.0, 0.1]
    with pytest.raises(ValueError, match="one per completion"):
        sara_reward(["", ""], ["a", "b"], sara_reward=[1.0])


def test_the_adapter_goes_through_public_api_only():
    """It fills in GRPOTrainer's constructor arguments and overrides no method of TRL's."""
    from trl import GRPOTrainer

    from sara_integrations.trl import SaraGRPOTrainer

    overridden = [name for name in vars(SaraGRPOTrainer)
                  if name in vars(GRPOTrainer) or hasattr(GRPOTrainer, name)]
    assert set(overridden) <= {
        "__init__", "__doc__", "__module__", "__qualname__", "__firstlineno__",
        "__static_attributes__", "__dict__", "__weakref__"}


@pytest.mark.parametrize("version", ["1.15.2", "1.17.0", "2.0.0"])
def test_other_trl_releases_are_refused_with_the_supported_range(version):
    from trl import GRPOTrainer

    from sara_integrations.trl import check_trl

    with pytest.raises(ImportError, match=r"supports TRL 1\.16\.x only.*found TRL "
                                          + version.replace(".", r"\.")):
        check_trl(version, GRPOTrainer)


def test_the_installed_trl_is_a_supported_one_that_takes_a_rollout_func():
    import trl
    from trl import GRPOTrainer

    from sara_integrations.trl import check_trl

    check_trl(trl.__version__, GRPOTrainer)
    check_trl("1.16.9", GRPOTrainer)

    class Older:   # a 1.16 whose trainer takes no rollout_func
        def __init__(self, model, reward_funcs):
            pass

    with pytest.raises(ImportError, match="rollout_func"):
        check_trl("1.16.0", Older)
