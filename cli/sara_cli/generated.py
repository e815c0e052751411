"""Command-line options generated from a configuration class, so that everything a user can set
is a flag with its help, not only what a command names by hand.

A command declares the options that are its own and gets one more option per configuration
field: `--field-name` (or a contract name such as `sara train --steps` for `max_steps`), typed as
the field is, defaulting to unset (the configuration's own default, shown in the help, or its
environment variable, then applies), in the help panel of the field's group. Secrets get none: a
command line is visible to every user of the machine. The command receives what was given as
one dict, `generated`, keyed by field name.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

SIMPLE = (str, int, float, bool, Path)
UNGROUPED = "Other settings"
Groups = Iterable[tuple[str, Sequence[str]]]   # (panel title, field names) in panel order


@dataclasses.dataclass(frozen=True)
class FieldFlag:
    """One generated option: the field it sets, its type on the command line, its help, its
    help panel, the default shown (None: none), and its name when not `--field-name`."""

    name: str
    kind: type
    help: str
    panel: str
    default: str | None = None
    option: str | None = None

    @property
    def flag(self) -> str:
        """The option's name on the command line."""
        return self.option or "--" + self.name.replace("_", "-")


def shown_default(value: Any) -> str | None:
    """A default as the help shows it: a switch by its flag, infinity as inf, unset as none."""
    if value is None or value is dataclasses.MISSING or callable(value):
        return None
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)


def _ordered(names: Iterable[str], groups: Groups) -> list[tuple[str, str]]:
    """(field, panel) for each field in `names`, in the groups' order; a field in no group
    (the groups have fallen behind the configuration, which tests/unit/test_cli_help.py
    catches) still gets its flag, in a last panel of its own."""
    names = list(names)
    panels = [(name, title) for title, fields in groups for name in fields if name in names]
    placed = {name for name, _ in panels}
    return panels + [(name, UNGROUPED) for name in names if name not in placed]


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


def settings_flags(model: type, skip: set[str], groups: Groups,
                   options: Mapping[str, str] | None = None) -> list[FieldFlag]:
    """A flag for each field of a pydantic settings class but those in `skip`, in the panels of
    `groups`; `options` renames some (field -> flag)."""
    info = model.model_fields  # type: ignore[attr-defined]
    out = []
    for name, panel in _ordered([n for n in info if n not in skip], groups):
        kind = _command_line_type(info[name].annotation)
        if kind is not None:
            out.append(FieldFlag(name, kind, (info[name].description or "").strip(), panel,
                                 shown_default(info[name].default),
                                 (options or {}).get(name)))
    return out


def dataclass_flags(cls: type, skip: set[str], groups: Groups,
                    options: Mapping[str, str] | None = None) -> list[FieldFlag]:
    """A flag for each field of a dataclass but those in `skip`, with its `metadata["help"]`,
    in the panels of `groups`; `options` renames some (field -> flag)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out = []
    for name, panel in _ordered([n for n in fields if n not in skip], groups):
        f, kind = fields[name], _command_line_type(hints[name])
        if kind is not None:
            out.append(FieldFlag(name, kind, f.metadata.get("help", ""), panel,
                                 shown_default(f.default), (options or {}).get(name)))
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
        for f in added:
            params += _parameters(f)
        names = {f.name for f in added}
        negatives = {_negative(f): f.name for f in added if f.kind is bool}

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            generated = {k: v for k, v in given.items() if k in names and v is not None}
            generated |= {field: False for param, field in negatives.items() if given.get(param)}
            return command(**{k: v for k, v in given.items()
                              if k not in names and k not in negatives},
                           generated=generated)

        # the command's own parameters, then the generated ones (keyword-only, so order holds)
        run.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__   # typer must read the new signature, not the command's
        return run

    return decorate



def _negative(f: FieldFlag) -> str:
    """The parameter of a switch's --no- form."""
    return "no_" + f.name


def _parameters(f: FieldFlag) -> list[inspect.Parameter]:
    """The command parameters of a generated flag. A switch is two: `--x`, shown, and `--no-x`,
    hidden and named in the help of `--x`. As one `--x/--no-x` option the help would give the
    --no- forms a column of their own, which at 80 columns leaves too little room to show the
    names whole."""
    shown = f.default if f.default is not None else False
    if f.kind is not bool:
        return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                  annotation=Annotated[Optional[f.kind], typer.Option(
                                      f.flag, help=f.help or None, rich_help_panel=f.panel,
                                      show_default=shown)])]
    off = "--no-" + f.flag[2:]
    on = typer.Option(f.flag, help=f"{f.help} Off: {off}.".strip(), rich_help_panel=f.panel,
                      show_default=shown)
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation=Annotated[Optional[bool], on]),
            inspect.Parameter(_negative(f), inspect.Parameter.KEYWORD_ONLY, default=False,
                              annotation=Annotated[bool, typer.Option(off, hidden=True)])]
