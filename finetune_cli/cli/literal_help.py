"""``--help`` shows every help string as it is written in the source.

Typer draws help with rich and reads each help string as rich markup: ``[x]`` is taken for a style
tag and ``:a:`` for an emoji code, so ``uniform:A:B`` (a ``sweep --param`` spec) came out as
``uniform🅰B``. Typer's one literal mode (``rich_markup_mode=None``) also drops the rich panels, and
rich escapes brackets but has no escape for emoji codes. So the command classes here keep typer's
rich help and, only while it is being formatted, hand it markup that renders to the text as written:
shell completion, error messages and anything else that reads ``help`` see the plain string.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from typing import Any

import typer.core
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

# An empty span of the null style: it renders as nothing, but rich looks for emoji codes only
# within the text between two tags, so one after each colon leaves no ``:name:`` to replace.
_SPLIT = "[none][/none]"


def as_markup(text: str) -> str:
    """Rich markup that renders as ``text``: brackets escaped, emoji codes split; a docstring's
    reStructuredText double backticks as the single ones a terminal reader expects, and its hard
    line breaks inside a paragraph joined (rich wraps to the terminal; a blank line stays a break)."""
    text = re.sub(r"(?<!\n)[ \t]*\n[ \t]*(?!\n)", " ", text.replace("``", "`"))
    return escape(text).replace(":", ":" + _SPLIT)


# Typer's type column says `<str>`, `<bool>`, `<int range>`: click's words instead, and nothing for a flag.
_TYPE_WORDS = {"str": "TEXT", "int": "INTEGER", "int range": "INTEGER", "float": "FLOAT", "float range": "FLOAT",
               "path": "PATH", "bool": ""}


def _type_word(param: Any, ctx: Any) -> Any:
    if getattr(param, "is_flag", False) or getattr(param, "is_bool_flag", False):
        return ""
    shown = type(param).display_type_rich(param, ctx)
    if isinstance(shown, str) and shown.startswith("<") and shown.endswith(">"):
        return _TYPE_WORDS.get(shown[1:-1], shown[1:-1])
    return shown


@contextlib.contextmanager
def _markup_help(cmd: Any, ctx: Any) -> Iterator[None]:
    """Help strings of ``cmd``, its parameters and (a group) its subcommands as markup, restored after."""
    saved: list[tuple[Any, str, str]] = []
    targets = [(cmd, ("help", "short_help", "epilog"))]
    targets += [(p, ("help",)) for p in cmd.get_params(ctx)]
    targets += [(sub, ("help", "short_help")) for sub in getattr(cmd, "commands", {}).values()]
    typed = [p for p in cmd.get_params(ctx) if hasattr(p, "display_type_rich")]
    try:
        for p in typed:
            p.display_type_rich = functools.partial(_type_word, p)
        for obj, attrs in targets:
            for attr in attrs:
                value = getattr(obj, attr, None)
                if isinstance(value, str) and value:
                    saved.append((obj, attr, value))
                    setattr(obj, attr, as_markup(value))
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)
        for p in typed:
            p.__dict__.pop("display_type_rich", None)


class _LiteralHelp:
    def format_help(self, ctx: Any, formatter: Any) -> None:
        # Typer reads markup only in its rich mode (TYPER_USE_RICH=0 or another mode: plain click).
        if getattr(self, "rich_markup_mode", None) != "rich" or not getattr(typer.core, "HAS_RICH", True):
            return super().format_help(ctx, formatter)  # type: ignore[misc]
        with _markup_help(self, ctx):
            return super().format_help(ctx, formatter)  # type: ignore[misc]


class LiteralHelpCommand(_LiteralHelp, TyperCommand):
    """A command whose ``--help`` shows its help strings literally."""


class LiteralHelpGroup(_LiteralHelp, TyperGroup):
    """A group whose ``--help`` shows its own and its subcommands' help strings literally."""
