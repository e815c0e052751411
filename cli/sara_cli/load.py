"""`sara load`: register prompts from a file or dataset, or --synthetic sim prompts."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer

from . import common
from .common import DEFAULT_URL, TokenOpt, UrlOpt, fail

LOAD_CHUNK = 1000  # prompts per POST /prompts (the service accepts up to 10,000)
_Opt = typer.Option  # short alias: load has many options


def load(
    source: Annotated[Optional[str], typer.Argument(
        metavar="PATH_OR_NAME", help="JSONL or parquet file, a directory saved with "
        "datasets.save_to_disk, or a Hugging Face dataset name.")] = None,
    recipe: Annotated[Optional[str], _Opt(help="Built-in mapping: gsm8k or math.")] = None,
    prompt_field: Annotated[Optional[str], _Opt(help="Field holding the prompt.")] = None,
    answer_field: Annotated[Optional[str], _Opt(help="Field holding the answer.")] = None,
    id_field: Annotated[Optional[str], _Opt(help="Field holding a stable id.")] = None,
    extract: Annotated[Optional[str], _Opt(help="Answer extraction: none, hashes, boxed.")] = None,
    task: Annotated[Optional[str], _Opt(help="Verifier name (exact, math, ...).")] = None,
    chat: Annotated[Optional[bool], _Opt("--chat/--no-chat", help="Wrap the prompt in a user "
                                        "message (chat template).")] = None,
    instruction: Annotated[Optional[str], _Opt(help="Text appended to a chat prompt.")] = None,
    split: Annotated[str, _Opt(help="Dataset split.")] = "train",
    config: Annotated[Optional[str], _Opt(help="Dataset config (gsm8k: main).")] = None,
    limit: Annotated[Optional[int], _Opt(min=1, help="Load at most N prompts.")] = None,
    synthetic: Annotated[Optional[int], typer.Option(min=1, help="Generate N sim prompts.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of --synthetic.")] = 0,
    dry_run: Annotated[bool, typer.Option(help="Print the prompts as JSONL, post none.")] = False,
    url: UrlOpt = DEFAULT_URL,
    token: TokenOpt = None,
) -> None:
    """Register prompts from a file or dataset, or --synthetic N sim prompts.

    Without --recipe or field options, rows must be prompts in the service's shape (prompt,
    answer, task, id, meta). --recipe gsm8k / math map the public datasets' fields, extract the
    answer and wrap the question in a chat message with an instruction.

    --synthetic draws the standard pool: 30% γ=0, 25% γ=1, 45% γ~Beta(2,2), ids p0…p{N-1},
    meta.p_success = γ (what the sim worker backend reads)."""
    if (source is None) == (synthetic is None):
        raise fail("give either a file or dataset, or --synthetic N", 2)
    if synthetic is not None:
        from sara_worker.sim.pool import standard_pool

        prompts = standard_pool(synthetic, seed)
    else:
        fields = dict(prompt_field=prompt_field, answer_field=answer_field, id_field=id_field,
                      extract=extract, task=task, chat=chat, instruction=instruction)
        prompts = read_source(source, recipe, fields, split, config, limit)
    if dry_run:
        for p in prompts:
            typer.echo(json.dumps(p))
        return
    if not prompts:
        raise fail("no prompts to load", 2)
    created = _post(prompts, url, token)
    typer.echo(f"loaded {len(prompts)} prompts ({created} new) into {url}")


def read_source(source: str, recipe: str | None, fields: dict[str, Any], split: str,
                config: str | None, limit: int | None) -> list[dict]:
    """Prompts from a file or dataset (sara_integrations.data does the work; this only reports)."""
    from sara_integrations.data import load_prompts, mapping_for

    try:
        # no recipe and no field option: rows are prompts already, as sara load always read them
        plain = recipe is None and all(v is None for v in fields.values())
        mapping = None if plain else mapping_for(recipe, **fields)
        loaded = load_prompts(source, mapping, split=split, config=config, limit=limit)
    except (ValueError, OSError) as e:  # bad row, unknown recipe, missing file or dataset
        raise fail(str(e), 2) from None
    if loaded.skipped:
        typer.echo(f"skipped {loaded.skipped} rows without a prompt or an extractable answer",
                   err=True)
    return loaded.prompts


def _post(prompts: list[dict], url: str, token: str | None) -> int:
    """POST the prompts in chunks of LOAD_CHUNK; how many were new. A failure is one line."""
    created = 0
    try:
        client = common.client(url, token)
        try:
            for i in range(0, len(prompts), LOAD_CHUNK):
                answer = client.add_prompts(prompts[i:i + LOAD_CHUNK])
                created += common.field(answer, "created") or 0
        finally:
            common.close(client)
    except Exception as e:  # connection refused, 4xx/5xx: one line, not a traceback
        raise fail(f"load failed after {created} new prompts: {e}", 1) from None
    return created
