"""Real prompt sets in: answer extraction, recipes, field mapping, and the JSONL,
parquet and Hugging Face readers on the fixture files under tests/fixtures/data (written for these
tests in the public datasets' formats, not copied from them), through the library and
`sara load`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sara_integrations.data import (
    BOXED_INSTRUCTION, GSM8K_INSTRUCTION, extract_after_hashes, extract_boxed, load_prompts,
    map_rows, mapping_for, row_to_prompt,
)
from sara_cli import main as cli

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "data"
GSM8K_ANSWERS = ["34", "210", "3600", "13"]
MATH_ANSWERS = ["\\frac{7}{8}", "6", "4", "\\{-3, 3\\}"]
runner = CliRunner()


# --- pure parts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    ("work\n#### 42", "42"), ("#### 1,234,567", "1234567"), ("a #### 1 #### -7.5 ", "-7.5"),
    ("no marker 42", None), ("#### ", None),
])
def test_extract_after_hashes(text, want):
    assert extract_after_hashes(text) == want


@pytest.mark.parametrize("text, want", [
    ("so $\\boxed{5}$", "5"),
    ("\\boxed{\\frac{1}{2}} then \\boxed{\\sqrt{x^{2}}}", "\\sqrt{x^{2}}"),
    ("\\fbox{7}", "7"), ("\\boxed {a}", "a"), ("\\boxed{unclosed", None), ("none", None),
    ("\\boxed{}", None),
])
def test_extract_boxed(text, want):
    assert extract_boxed(text) == want


def test_gsm8k_recipe_maps_a_row_to_a_chat_prompt():
    row = {"question": "2 + 3?", "answer": "2 + 3 = 5\n#### 5"}
    assert row_to_prompt(row, mapping_for("gsm8k")) == {
        "prompt": [{"role": "user", "content": f"2 + 3?\n\n{GSM8K_INSTRUCTION}"}],
        "task": "math", "answer": "5"}


def test_math_recipe_takes_a_bare_answer_field_and_passes_messages_through():
    dapo = {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}
    mapping = mapping_for("math", prompt_field="prompt", answer_field="reward_model.ground_truth")
    assert row_to_prompt(dapo, mapping) == {"prompt": dapo["prompt"], "task": "math",
                                            "answer": "2"}
    plain = mapping_for("math", chat=False)
    got = row_to_prompt({"problem": "x?", "solution": "\\boxed{3}"}, plain)
    assert got == {"prompt": "x?", "task": "math", "answer": "3"}
    assert BOXED_INSTRUCTION not in json.dumps(got)


def test_field_mapping_ids_meta_and_skips():
    mapping = mapping_for(None, prompt_field="q", answer_field="a", id_field="n", task="exact",
                          meta_fields=("level",))
    rows = [(1, {"q": "hi", "a": "x", "n": 7, "level": 2}), (2, {"q": "", "a": "y"}),
            (3, {"q": "no answer"})]
    loaded = map_rows(rows, mapping)
    assert loaded.skipped == 2
    assert loaded.prompts == [{"id": "7", "prompt": "hi", "answer": "x", "task": "exact",
                               "meta": {"level": 2}}]


def test_unknown_recipe_or_extraction_is_an_error():
    with pytest.raises(ValueError, match="recipe"):
        mapping_for("gsm9k")
    with pytest.raises(ValueError, match="extraction"):
        mapping_for(None, extract="regex")


def test_limit_and_a_bad_plain_row_names_its_place():
    rows = [(1, {"prompt": "a"}), (2, {"prompt": "b"}), (3, {"prompt": "c"})]
    assert len(map_rows(rows, None, limit=2).prompts) == 2
    with pytest.raises(ValueError, match="f.jsonl:2"):
        map_rows([(1, {"prompt": "a"}), (2, {"prompt": "b", "bogus": 1})], None, label="f.jsonl")


# --- readers on the shipped fixtures -------------------------------------------------------------


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_gsm8k_fixture_files(suffix):
    loaded = load_prompts(str(DATA / f"gsm8k_sample.{suffix}"), mapping_for("gsm8k"))
    assert [p["answer"] for p in loaded.prompts] == GSM8K_ANSWERS
    assert loaded.skipped == 1  # the row without a '####' line
    assert all(p["task"] == "math" and p["prompt"][0]["role"] == "user" for p in loaded.prompts)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_math_fixture_files(suffix):
    loaded = load_prompts(str(DATA / f"math_sample.{suffix}"), mapping_for("math"))
    assert [p["answer"] for p in loaded.prompts] == MATH_ANSWERS and loaded.skipped == 0


def test_hf_dataset_saved_to_disk_and_a_local_data_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [json.loads(x) for x in (DATA / "gsm8k_sample.jsonl").read_text().splitlines()]
    saved = tmp_path / "gsm8k"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved))
    loaded = load_prompts(str(saved), mapping_for("gsm8k"), split="train")
    assert [p["answer"] for p in loaded.prompts] == GSM8K_ANSWERS
    with pytest.raises(ValueError, match="splits"):
        load_prompts(str(saved), mapping_for("gsm8k"), split="test")
    # the builder path a hub name takes, on a local file ("parquet" is the builder's name)
    built = datasets.load_dataset("parquet", data_files=str(DATA / "math_sample.parquet"),
                                  split="train", cache_dir=str(tmp_path / "cache"))
    mapped = map_rows(enumerate(built, 1), mapping_for("math"))
    assert [p["answer"] for p in mapped.prompts] == MATH_ANSWERS


def test_a_file_of_unknown_type_is_an_error(tmp_path):
    f = tmp_path / "data.csv"
    f.write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown file type"):
        load_prompts(str(f))


# --- sara load -----------------------------------------------------------------------------------


def test_sara_load_recipe_dry_run_prints_validated_prompts():
    result = runner.invoke(cli.app, ["load", str(DATA / "gsm8k_sample.parquet"),
                                     "--recipe", "gsm8k", "--dry-run", "--limit", "3"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.output.splitlines() if x.startswith("{")]
    assert [p["answer"] for p in lines] == GSM8K_ANSWERS[:3]


def test_sara_load_field_mapping_without_a_recipe():
    result = runner.invoke(cli.app, ["load", str(DATA / "math_sample.jsonl"), "--dry-run",
                                     "--prompt-field", "problem", "--answer-field", "solution",
                                     "--extract", "boxed", "--task", "math", "--chat"])
    assert result.exit_code == 0, result.output
    first = json.loads(result.output.splitlines()[0])
    assert first["answer"] == "\\frac{7}{8}" and first["prompt"][0]["role"] == "user"


@pytest.mark.parametrize("args, words", [
    (["--recipe", "nope"], "unknown recipe"),
    (["--extract", "nope"], "unknown extraction"),
])
def test_sara_load_bad_options_exit_2(args, words):
    result = runner.invoke(cli.app, ["load", str(DATA / "math_sample.jsonl"), *args])
    assert result.exit_code == 2 and words in result.output


def test_sara_load_missing_source_exits_2(tmp_path):
    pytest.importorskip("datasets")
    result = runner.invoke(cli.app, ["load", str(tmp_path / "missing.jsonl"), "--dry-run"],
                           env={"HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.exit_code == 2, result.output


def test_recipe_answers_score_with_their_verifier():
    """The answer a recipe extracts is one its verifier (math-verify) accepts from a completion
    written the way the recipe's instruction asks, and refuses a wrong one."""
    pytest.importorskip("math_verify")
    from sara_worker.verifiers import get as get_verifier

    gsm8k = load_prompts(str(DATA / "gsm8k_sample.jsonl"), mapping_for("gsm8k")).prompts
    math = load_prompts(str(DATA / "math_sample.jsonl"), mapping_for("math")).prompts
    for p in gsm8k:
        verify = get_verifier(p["task"])
        assert verify(f"Working.\n#### {p['answer']}", p["answer"], {}) == 1.0
        assert verify("Working.\n#### 99999", p["answer"], {}) == 0.0
    for p in math:
        assert get_verifier(p["task"])(f"so \\boxed{{{p['answer']}}}", p["answer"], {}) == 1.0
