"""Command-line options generated from a configuration class, so that everything a user can set
is a flag with its help, not only what a command names by hand.

A command declares the options it wants to present itself (with their contract names, such as
`sara train --steps` for `max_steps`) and gets one more option per remaining field: `--field-name`,
typed as the field is, defaulting to unset (the configuration's own default, or its environment
variable, then applies). Secrets get none: a command line is visible to every user of the machine.
The command receives what was given as one dict, `generated`, keyed by field name.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

PANEL = "Every other setting"
SIMPLE = (str, int, float, bool, Path)


@dataclasses.dataclass(frozen=True)
class FieldFlag:
    """One generated option: the field it sets, its type on the command line, and its help."""

    name: str
    kind: type
    help: str


def _command_line_type(annotation: Any) -> type | None:
    """The type a flag parses for a field's annotation; None for a field no flag can carry (a
    secret, a mapping). A choice (Literal) or a number-or-word (`float | "auto"`) is parsed as
    text and checked by the configuration, whose error names the choices."""
    if annotation in SIMPLE:
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str
    if origin in (typing.Union, types.UnionType):
        kinds = [_command_line_type(a) for a in args]
        if None in kinds:
            return None
        return kinds[0] if len(set(kinds)) == 1 else str
    if origin is Annotated:
        return _command_line_type(args[0])
    return None


def settings_flags(model: type, skip: set[str]) -> list[FieldFlag]:
    """A flag for each field of a pydantic settings class but those in `skip`."""
    out = []
    for name, info in model.model_fields.items():
        kind = _command_line_type(info.annotation)
        if name in skip or kind is None:
            continue
        out.append(FieldFlag(name, kind, (info.description or "").strip()))
    return out


def dataclass_flags(cls: type, skip: set[str]) -> list[FieldFlag]:
    """A flag for each field of a dataclass but those in `skip`, with its `metadata["help"]`."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = _command_line_type(hints[f.name])
        if f.name in skip or kind is None:
            continue
        out.append(FieldFlag(f.name, kind, f.metadata.get("help", "")))
    return out


def with_generated_flags(flags: list[FieldFlag]) -> Callable[[Callable], Callable]:
    """Decorate a typer command that takes `generated: dict` with one option per flag; the
    command's own parameters keep their names, order and help."""

    def decorate(command: Callable) -> Callable:
        own = inspect.signature(command, eval_str=True)
        hints = typing.get_type_hints(command, include_extras=True)
        params = [p.replace(annotation=hints.get(p.name, p.annotation))
                  for p in own.parameters.values() if p.name != "generated"]
        taken = {p.name for p in params}
        added = [f for f in flags if f.name not in taken]
        params += [inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
            annotation=Annotated[Optional[f.kind], typer.Option(
                help=f.help or None, rich_help_panel=PANEL, show_default=False)])
            for f in added]
        names = {f.name for f in added}

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            generated = {k: v for k, v in given.items() if k in names and v is not None}
            return command(**{k: v for k, v in given.items() if k not in names},
                           generated=generated)

        # the command's own parameters, then the generated ones (keyword-only, so order holds)
        run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__   # typer must read the new signature, not the command's
        return run

    return decorate

