"""Real prompt sets in: rows from JSONL, parquet or a Hugging Face dataset, mapped to prompts.

`sara load` parses its options and calls `load_prompts`; everything here but the readers is pure
(rows in, prompt dicts out), so recipes and answer extraction are tested without files.

Sources, by what `source` names:
- a `.jsonl` / `.json` file: one JSON object a line;
- a `.parquet` file: read with pyarrow (`pip install 'sara-rollout[data]'`);
- a directory: a dataset saved with `datasets.save_to_disk` (a DatasetDict gives `split`);
- anything else: a Hugging Face dataset name (`datasets.load_dataset(name, config, split=...)`).
`datasets` and `pyarrow` are imported only when a source needs them.

Recipes fill in the field mapping, answer extraction, verifier and a chat instruction:
- `gsm8k`: `question` / `answer`, the gold number after `#### ` (commas dropped), verifier `math`;
- `math`: `problem` / `solution` (MATH, DAPO style), the last `\\boxed{}` of the solution,
  verifier `math` (math-verify).
Without a recipe and without field options, rows are taken in the service's own shape
(`prompt`, `answer`, `task`, `id`, `meta`), as `sara load` always read JSONL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sara_client.models import PromptIn

GSM8K_INSTRUCTION = ("Solve the problem step by step. Put the final answer, a number alone, "
                     "on the last line after ####.")
BOXED_INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}."


# --- answer extraction ---------------------------------------------------------------------------


def extract_after_hashes(text: str) -> str | None:
    """GSM8K's gold answer: what follows the last `####`, thousands separators dropped
    ('#### 1,234' -> '1234'); None when there is no `####`."""
    if "####" not in text:
        return None
    answer = text.rsplit("####", 1)[1].strip().replace(",", "")
    return answer or None


def extract_boxed(text: str) -> str | None:
    """Contents of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces kept; None when there
    is none or its braces do not close."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip() or None
    return None


def extract_boxed_or_text(text: str) -> str | None:
    """The last `\\boxed{}` when there is one, else the whole text (a field that already holds
    the bare answer, such as DAPO's or MATH-500's `answer`)."""
    return extract_boxed(text) or (text.strip() or None)


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "none": lambda text: text.strip() or None,
    "hashes": extract_after_hashes,
    "boxed": extract_boxed_or_text,
}


# --- mapping rows to prompts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Mapping:
    """How one row becomes a prompt: which fields, how the answer is extracted, which verifier
    scores it, and whether the prompt is wrapped in a chat user message with an instruction."""

    prompt_field: str = "prompt"
    answer_field: str | None = "answer"
    id_field: str | None = None
    extract: str = "none"
    task: str = "exact"
    chat: bool = False
    instruction: str | None = None
    meta_fields: tuple[str, ...] = field(default_factory=tuple)
    hf_config: str | None = None


RECIPES: dict[str, Mapping] = {
    "gsm8k": Mapping(prompt_field="question", answer_field="answer", extract="hashes",
                     task="math", chat=True, instruction=GSM8K_INSTRUCTION, hf_config="main"),
    "math": Mapping(prompt_field="problem", answer_field="solution", extract="boxed",
                    task="math", chat=True, instruction=BOXED_INSTRUCTION),
}


def mapping_for(recipe: str | None = None, **overrides: Any) -> Mapping:
    """A recipe's mapping (or the plain one) with the options given (None means 'keep')."""
    if recipe is not None and recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}; choose from {', '.join(sorted(RECIPES))}")
    base = RECIPES[recipe] if recipe else Mapping()
    given = {k: v for k, v in overrides.items() if v is not None}
    if "extract" in given and given["extract"] not in EXTRACTORS:
        raise ValueError(f"unknown extraction {given['extract']!r}; choose from "
                         f"{', '.join(EXTRACTORS)}")
    return replace(base, **given)


def _lookup(row: dict[str, Any], name: str) -> Any:
    """A field by name; a dotted name reaches into nested objects ('reward_model.ground_truth')."""
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _prompt_content(value: Any, mapping: Mapping) -> Any:
    """Text, or chat messages: a field that already holds messages passes through as is."""
    if isinstance(value, list):
        return value
    text = str(value).strip()
    if not mapping.chat:
        return text
    content = f"{text}\n\n{mapping.instruction}" if mapping.instruction else text
    return [{"role": "user", "content": content}]


def row_to_prompt(row: dict[str, Any], mapping: Mapping) -> dict[str, Any] | None:
    """One row as a prompt dict (PromptIn's shape); None when the row has no prompt or no
    answer can be extracted (the caller counts those as skipped)."""
    value = _lookup(row, mapping.prompt_field)
    if value is None or value == "" or value == []:
        return None
    out: dict[str, Any] = {"prompt": _prompt_content(value, mapping), "task": mapping.task}
    if mapping.answer_field:
        raw = _lookup(row, mapping.answer_field)
        answer = None if raw is None else EXTRACTORS[mapping.extract](str(raw))
        if answer is None:
            return None
        out["answer"] = answer
    if mapping.id_field and _lookup(row, mapping.id_field) is not None:
        out["id"] = str(_lookup(row, mapping.id_field))
    meta = {k: _lookup(row, k) for k in mapping.meta_fields if _lookup(row, k) is not None}
    if meta:
        out["meta"] = meta
    return out


@dataclass
class Loaded:
    """Validated prompts (dicts ready for add_prompts) and how many rows were skipped."""

    prompts: list[dict[str, Any]]
    skipped: int = 0


def map_rows(rows: Iterable[tuple[int, dict[str, Any]]], mapping: Mapping | None,
             limit: int | None = None, label: str = "row") -> Loaded:
    """(position, row) pairs to validated prompts. Without a mapping a row must already be a
    prompt (a bad one is an error naming `label:position`); with one, rows without a prompt or
    answer are skipped and counted."""
    out = Loaded([])
    for n, row in rows:
        if limit is not None and len(out.prompts) >= limit:
            break
        prompt = row if mapping is None else row_to_prompt(row, mapping)
        if prompt is None:
            out.skipped += 1
            continue
        try:
            out.prompts.append(PromptIn.model_validate(prompt).model_dump(exclude_none=True))
        except ValueError as e:  # pydantic's ValidationError
            raise ValueError(f"{label}:{n}: not a valid prompt: {e}") from None
    return out


# --- readers -------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSONL file, blank lines skipped; a bad line is an error naming
    its number."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: not JSON: {e}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: not a JSON object")
            yield lineno, row


def read_parquet(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, row) of a parquet file, read in record batches so a large file is never
    whole in memory."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError("reading parquet needs pyarrow: "
                         "pip install 'sara-rollout[data]'") from None
    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            n += 1
            yield n, row


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise ValueError("Hugging Face datasets need the datasets package: "
                         "pip install 'sara-rollout[data]'") from None
    return datasets


def read_hf(source: str, split: str, config: str | None = None
            ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(row number, row) of a Hugging Face dataset: a directory saved with save_to_disk, or a
    hub name (read from the local cache when HF_DATASETS_OFFLINE=1)."""
    datasets = _datasets()
    if Path(source).is_dir():
        data = datasets.load_from_disk(source)
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ValueError(f"{source} has splits {sorted(data)}, not {split!r}")
            data = data[split]
    else:
        data = datasets.load_dataset(source, config, split=split)
    yield from enumerate(data, 1)


FILE_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet")


def read_rows(source: str, split: str = "train", config: str | None = None
              ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(position, row) of `source`: a JSONL or parquet file by suffix, else a Hugging Face
    dataset."""
    path = Path(source)
    if path.is_file():
        if path.suffix == ".parquet":
            return read_parquet(path)
        if path.suffix in FILE_SUFFIXES:
            return read_jsonl(path)
        raise ValueError(f"{source}: unknown file type {path.suffix!r} (.jsonl or .parquet)")
    if path.suffix in FILE_SUFFIXES:  # clearly meant as a file: do not ask the hub for it
        raise ValueError(f"{source}: no such file")
    return read_hf(source, split, config)


def load_prompts(source: str, mapping: Mapping | None = None, split: str = "train",
                 config: str | None = None, limit: int | None = None) -> Loaded:
    """Prompts from `source` (see the module doc), mapped by `mapping` (None: rows are already
    prompts). A recipe's Hugging Face config (gsm8k's 'main') applies unless `config` is given."""
    config = config or (mapping.hf_config if mapping else None)
    return map_rows(read_rows(source, split, config), mapping, limit, source)
