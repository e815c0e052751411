"""`sara prompts list|disable|enable|delete` and `sara run pause|resume|drain|status`: run
control for operators, through the SDK (listing needs an operator token, changes an admin one)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Callable, Optional

import typer

from .common import DEFAULT_URL, UrlOpt

TokenOpt = Annotated[Optional[str], typer.Option(
    "--token", envvar="SARA_TOKEN", help="Bearer token (admin; operator for listing).")]
PromptArg = Annotated[list[str], typer.Argument(help="Prompt ids.")]

prompts_app = typer.Typer(help="List, disable, enable or delete prompts.", no_args_is_help=True)
run_app = typer.Typer(help="Pause, resume or drain the run, or show its state.",
                      no_args_is_help=True)


def _call(url: str, token: str | None, what: str, fn: Callable[[Any], Any]) -> Any:
    """Run `fn(client)`; any failure is one line on stderr and exit 1, not a traceback."""
    from sara_client import SaraClient

    try:
        with SaraClient(url, token=token) as client:
            return fn(client)
    except Exception as e:
        typer.echo(f"{what} failed: {e}", err=True)
        raise typer.Exit(1) from None


@prompts_app.command("list")
def list_prompts(
    limit: Annotated[int, typer.Option(min=0, help="Stop after this many prompts (0: all).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
) -> None:
    """Prompts with their state, posterior mean and history, page by page."""
    def rows(client: Any) -> list[Any]:
        out = []
        for p in client.iter_prompts(page_size=min(limit or 500, 500)):
            out.append(p)
            if limit and len(out) >= limit:
                break
        return out

    for p in _call(url, token, "prompts list", rows):
        if as_json:
            typer.echo(json.dumps(p.model_dump(mode="json")))
            continue
        post, hist = p.posterior, p.history
        mean = post.alpha / (post.alpha + post.beta)
        typer.echo(f"{p.id}\t{p.state}\tp={mean:.3f} (a={post.alpha:g} b={post.beta:g})\t"
                   f"groups={hist.groups} rollouts={hist.rollouts} successes={hist.successes}")


def _each(ids: list[str], url: str, token: str | None, what: str,
          fn: Callable[[Any, str], Any]) -> None:
    for pid in ids:
        out = _call(url, token, f"{what} {pid}", lambda c, pid=pid: fn(c, pid))
        typer.echo(f"{out.id}\t{out.state}")


@prompts_app.command("disable")
def disable(ids: PromptArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Never open these prompts again; their groups in flight finish."""
    _each(ids, url, token, "disable", lambda c, pid: c.set_prompt_enabled(pid, False))


@prompts_app.command("enable")
def enable(ids: PromptArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Put disabled prompts back into the pool."""
    _each(ids, url, token, "enable", lambda c, pid: c.set_prompt_enabled(pid, True))


@prompts_app.command("delete")
def delete(ids: PromptArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Delete prompts and their posteriors; groups in flight are still delivered."""
    _each(ids, url, token, "delete", lambda c, pid: c.delete_prompt(pid))


def _run_command(action: str, doc: str) -> None:
    def command(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
        if action == "status":
            out = _call(url, token, "run status", lambda c: c.run_status())
        else:
            out = _call(url, token, f"run {action}", lambda c: c.control_run(action))
        typer.echo(f"{out.namespace}\t{out.state}")
        for warning in out.warnings:   # what holds the run up (a drain that never ends ...)
            typer.echo(f"warning: {warning}", err=True)

    command.__doc__ = doc
    run_app.command(action)(command)


_run_command("pause", "Workers get empty leases; results are accepted, ready groups batched.")
_run_command("resume", "Back to running: groups open and rollouts are leased again.")
_run_command("drain", "No new groups; in-flight work finishes and is delivered, then drained.")
_run_command("status", "Show running | paused | draining | drained.")
