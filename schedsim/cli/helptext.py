"""typer's rich ``--help``, tidied (imported once by :mod:`schedsim.cli.common`): the fixes
are installed the first time a help page is formatted, so a command that prints no help
never imports typer's rich formatting (rich, markdown-it, pygments)."""
from __future__ import annotations

import inspect
from typing import Any


def _tidy_help() -> None:
    """typer's rich ``--help``, two fixes: flags that take no value show no ``<bool>``
    type, and example lines (indented, or starting with ``$``, ``schedsim`` or ``python``)
    keep their own lines (write them under 78 characters, so that an 80-column terminal
    shows each whole), while prose lines are reflowed to the terminal width. Leaves typer
    alone when its internals are not the expected ones."""
    try:
        from rich.text import Text
        from typer import core, rich_utils
    except ImportError:  # pragma: no cover
        return
    opt = getattr(core, "TyperOption", None)
    orig = getattr(opt, "display_type_rich", None)
    if orig is not None and not getattr(orig, "_schedsim", False):
        def display_type_rich(self: Any, ctx: Any) -> Any:
            if getattr(self, "is_flag", False) and not getattr(self, "count", False):
                return None
            return orig(self, ctx)
        display_type_rich._schedsim = True      # type: ignore[attr-defined]
        opt.display_type_rich = display_type_rich
    make = getattr(rich_utils, "_make_rich_text", None)
    if make is None or not hasattr(rich_utils, "_get_help_text"):
        return
    style = getattr(rich_utils, "STYLE_HELPTEXT", "dim")

    def is_example(line: str) -> bool:
        return line.startswith((" ", "$ ", "schedsim ", "python "))

    def get_help_text(*, obj: Any, markup_mode: Any) -> Any:
        from rich.console import Group

        text = inspect.cleandoc(obj.help or "").partition("\f")[0]
        first, *rest = text.split("\n\n")
        parts: list[Any] = [make(text=first.replace("\n", " ").strip(),
                                 style=getattr(rich_utils, "STYLE_HELPTEXT_FIRST_LINE", ""),
                                 markup_mode=markup_mode)]
        for para in rest:
            parts.append(Text(""))
            prose: list[str] = []
            for line in para.split("\n") + [""]:
                if line and not is_example(line):
                    prose.append(line.strip())
                    continue
                if prose:
                    parts.append(make(text=" ".join(prose), style=style,
                                      markup_mode=markup_mode))
                    prose = []
                if line:
                    parts.append(Text(line.replace("\\[", "["), style=style))
        return Group(*parts)

    rich_utils._get_help_text = get_help_text


def _tidy_on_first_help() -> None:
    """Run :func:`_tidy_help` just before typer formats its first help page (its
    commands' and groups' ``format_help``)."""
    from typer import core

    for cls in (getattr(core, "TyperCommand", None), getattr(core, "TyperGroup", None)):
        orig = getattr(cls, "format_help", None)
        if orig is None or getattr(orig, "_schedsim", False):
            continue

        def format_help(self: Any, ctx: Any, formatter: Any, _orig: Any = orig) -> Any:
            _tidy_help()
            return _orig(self, ctx, formatter)
        format_help._schedsim = True            # type: ignore[attr-defined]
        cls.format_help = format_help


_tidy_on_first_help()
