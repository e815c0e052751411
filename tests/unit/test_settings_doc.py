"""docs/settings.md is what `python -m sara_cli.settings_doc` prints from the code: a setting
added, renamed, regrouped or redescribed without regenerating it fails here."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from sara_cli import settings_doc
from sara_service.setting_groups import SETTING_GROUPS
from sara_service.settings import Settings
from sara_trainer.config import TrainerConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
REGENERATE = "python -m sara_cli.settings_doc > docs/settings.md"


def test_the_committed_reference_is_the_generated_one():
    assert DOC.read_text() == settings_doc.render(), f"docs/settings.md is stale: {REGENERATE}"


def test_the_module_prints_it():
    out = subprocess.run([sys.executable, "-m", "sara_cli.settings_doc"], capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout == settings_doc.render()
    assert REGENERATE in out.stdout.split("\n## ")[0]   # the command, at the top


def test_every_setting_and_trainer_field_is_documented_in_its_group():
    text = settings_doc.render()
    for group in SETTING_GROUPS:
        section = text.split(f"\n### {group.title}\n", 1)[1].split("\n### ", 1)[0]
        for name in group.fields:
            assert f"`SARA_{name.upper()}`" in section, name
            info = Settings.model_fields[name]
            assert " ".join((info.description or "").split()) in section, name
    for field in dataclasses.fields(TrainerConfig):
        if field.name != "extra":
            assert field.metadata["help"] in text, field.name
