"""`--help` at 80 columns: every flag name whole (none cut with "…"), the scheduler's and the
trainer's flags in a panel per settings group, in the groups' order, and no change history in
any help text."""

from __future__ import annotations

import dataclasses
import re

import click
import pytest
import typer
from typer.testing import CliRunner

from sara_cli import main as cli
from sara_service.setting_groups import INTERNAL, SETTING_GROUPS
from sara_service.settings import Settings
from sara_trainer.config import CONFIG_GROUPS, TrainerConfig

runner = CliRunner()
SECRETS = {"worker_token", "trainer_token", "operator_token", "admin_token", "worker_secret"}
PANEL_TITLE = re.compile(r"^╭─ (.+?) ─")
# words that tell a setting's past, which belongs in git: "(was 0.5)", "the old default"
HISTORY = re.compile(r"\bwas \d|\bold (default|name|rule)\b|\bpreviously\b|\bused to be\b|"
                     r"\bno longer\b|\bnow defaults?\b", re.IGNORECASE)


def _commands(group: click.Group, path: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


COMMANDS = list(_commands(typer.main.get_command(cli.app)))   # type: ignore[arg-type]


def help_at_80(path: tuple[str, ...]) -> str:
    result = runner.invoke(cli.app, [*path, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def panels(text: str) -> list[str]:
    return [m.group(1) for line in text.splitlines() if (m := PANEL_TITLE.match(line))]


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_flag_name_is_whole_at_80_columns(path, command):
    text = help_at_80(path)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert not re.search(r"…\s*│", text), f"a help text is cut:\n{text}"
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            for name in (*param.opts, *param.secondary_opts):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), \
                    f"{' '.join(path)}: {name} is not shown whole at 80 columns"


def test_sara_serve_shows_a_panel_per_settings_group_in_order():
    shown = panels(help_at_80(("serve",)))
    titles = [g.title for g in SETTING_GROUPS if g.key != "auth"] + ["Auth"]
    assert shown == ["Options", "Server", *titles]


def test_sara_serve_puts_each_setting_in_its_groups_panel():
    text = help_at_80(("serve",))
    where, panel = {}, None
    for line in text.splitlines():
        if m := PANEL_TITLE.match(line):
            panel = m.group(1)
        elif m := re.match(r"^│ (--[a-z0-9-]+)", line):
            where[m.group(1)] = panel
    for group in SETTING_GROUPS:
        for name in group.fields:
            flag = "--" + name.replace("_", "-")
            if name in SECRETS:
                assert flag not in where   # secrets: the environment only
            else:
                assert where[flag] == group.title, name


def test_sara_train_shows_a_panel_per_config_group_in_order():
    assert panels(help_at_80(("train",))) == ["Options", "Policy", "Run",
                                               *list(CONFIG_GROUPS)[1:]]


def test_settings_groups_hold_every_field_once():
    placed = [n for g in (*SETTING_GROUPS, INTERNAL) for n in g.fields]
    assert sorted(placed) == sorted(Settings.model_fields)
    placed = [n for fields in CONFIG_GROUPS.values() for n in fields]
    assert sorted(placed) == sorted(f.name for f in dataclasses.fields(TrainerConfig)
                                    if f.name != "extra")


def test_no_help_text_carries_change_history():
    texts = [f.description or "" for f in Settings.model_fields.values()]
    texts += [f.metadata.get("help", "") for f in dataclasses.fields(TrainerConfig)]
    texts += [help_at_80(path) for path, _ in COMMANDS]
    for text in texts:
        assert not HISTORY.search(text), HISTORY.search(text).group(0)
