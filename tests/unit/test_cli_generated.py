"""Flags generated from Settings and TrainerConfig: every field a user can set has one, a flag
reaches the configuration it names, and the names scripts call stay as they were."""

from __future__ import annotations

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from sara_cli import main as cli
from sara_service.settings import INTERNAL_SETTINGS, Settings
from sara_trainer.config import TrainerConfig

from .test_cli import serve_settings
from .test_cli_gpu import trained_config

runner = CliRunner()
SECRETS = {"worker_token", "trainer_token", "operator_token", "admin_token", "worker_secret"}


def _options(command: str) -> set[str]:
    """Every long option name of `sara COMMAND`."""
    group = typer.main.get_command(cli.app)
    params = group.commands[command].params   # type: ignore[attr-defined]
    return {o for p in params if p.param_type_name == "option" for o in p.opts}


def test_every_scheduler_setting_but_the_secrets_and_internals_is_a_flag_of_sara_serve():
    options = _options("serve")
    for name in set(Settings.model_fields) - SECRETS - INTERNAL_SETTINGS:
        assert "--" + name.replace("_", "-") in options, name
    # a command line is visible to every user of the machine; internals are no user's settings
    for name in SECRETS | INTERNAL_SETTINGS:
        assert "--" + name.replace("_", "-") not in options


def test_every_trainer_field_is_a_flag_of_sara_train_under_its_contract_name():
    options = _options("train")
    renamed = {"max_steps": "--steps", "advantage_estimator": "--estimator"}
    for f in dataclasses.fields(TrainerConfig):
        if f.name != "extra":   # a mapping: --set extra=...
            assert renamed.get(f.name, "--" + f.name.replace("_", "-")) in options, f.name
    assert "--max-steps" not in options and "--set" in options


def test_a_generated_serve_flag_reaches_the_settings_and_beats_the_environment(monkeypatch):
    monkeypatch.setenv("SARA_MAX_STALENESS", "5")
    settings = serve_settings(monkeypatch, ["--max-staleness", "3", "--prior", "history",
                                             "--no-pc-exclude-solved", "--posterior-half-life", "inf"])
    assert (settings.max_staleness, settings.prior, settings.pc_exclude_solved) == (
        3, "history", False)
    assert settings.posterior_half_life == float("inf")
    # unset flags leave the environment's value in force
    monkeypatch.setenv("SARA_TEMPERATURE", "0.7")
    assert serve_settings(monkeypatch, []).temperature == 0.7


@pytest.mark.parametrize("args, line", [
    (["--prior", "sometimes"], "--prior sometimes: must be 'uniform' or 'history'"),
    (["--max-staleness", "-1"], "--max-staleness -1: must be greater than or equal to 0")])
def test_a_bad_generated_serve_flag_exits_2_naming_the_flag(args, line):
    result = runner.invoke(cli.app, ["serve", *args])
    assert result.exit_code == 2
    assert "invalid settings" in result.output and line in result.output.splitlines()


def test_bad_settings_from_the_environment_name_the_variable_one_line_each():
    result = runner.invoke(cli.app, ["serve", "--policy", "bogus"],
                           env={"SARA_GROUP_SIZE": "0", "SARA_TAU_LOW": "2"})
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert lines[0] == "sara serve: invalid settings:"
    assert set(lines[1:]) == {
        "--policy bogus: must be 'uniform', 'dynamic_sampling', 'sara', 'reinforce_ada' or "
        "'pilot_commit'",
        "SARA_GROUP_SIZE=0: must be greater than or equal to 2",
        "SARA_TAU_LOW=2: must be less than or equal to 1 or 'auto'"}
    assert "group_size" not in result.output and "validation error" not in result.output


def test_a_rule_across_settings_is_one_line_naming_the_variables():
    result = runner.invoke(cli.app, ["serve"], env={"SARA_GRESO_P_START": "0.01"})
    assert result.exit_code == 2
    assert result.output.splitlines()[1:] == [
        "SARA_GRESO_P_START=0.01 must lie within SARA_GRESO_P_MIN=0.05 and "
        "SARA_GRESO_P_MAX=0.95"]


def test_a_generated_train_flag_reaches_the_config(monkeypatch):
    config = trained_config(monkeypatch, [
        "--model", "m", "--critic-lr", "0.001", "--no-std-unbiased",
        "--loss-aggregation", "seq-mean-token-mean", "--steps", "7", "--set", "extra={\"note\": 1}"])
    assert (config.critic_lr, config.std_unbiased, config.max_steps) == (1e-3, False, 7)
    assert config.loss_aggregation == "seq-mean-token-mean" and config.extra == {"note": 1}
    assert config.gae_lambda == TrainerConfig().gae_lambda   # not given: the default


def test_a_bad_generated_train_flag_exits_2_naming_the_field():
    result = runner.invoke(cli.app, ["train", "--model", "m", "--loss-aggregation", "mean"])
    assert result.exit_code == 2 and "loss_aggregation" in result.output


def test_sara_train_takes_every_default_from_trainer_config(monkeypatch):
    """Nothing but --model given: the config is TrainerConfig's own defaults, field by field
    (the command declares none of its own)."""
    config = trained_config(monkeypatch, ["--model", "m"])
    assert config == TrainerConfig(model="m")
    command = typer.main.get_command(cli.app).commands["train"]   # type: ignore[attr-defined]
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    for param in command.params:
        if param.name in fields:
            assert param.default is None, f"sara train declares a default for {param.name}"
