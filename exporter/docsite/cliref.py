"""Write the command-line reference page from the ``ddp-exporter`` argument parser itself.

The parser is handed in (the front door, :mod:`exporter.tools.cli`, builds it), so the page
documents exactly what ``--help`` says: every command, its description, usage and options.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from .markdown import code, md_text, page, table

__all__ = ["render_cli"]

#: Columns of the usage lines, whatever the terminal the generator runs in.
WIDTH = 96


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """Return ``(name, one-line help, parser)`` of each subcommand, in ``--help`` order."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return out


def _walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for _, _, sub in _subcommands(parser):
        yield from _walk(sub)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS, False) or action.nargs == 0:
        return ""
    if isinstance(action.default, list) and not action.default:
        return ""
    return code(action.default)


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "prog": parser.prog}
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        text += " (one of " + ", ".join(code(c) for c in action.choices) + ")"
    return md_text(text)


def _options(parser: argparse.ArgumentParser) -> str:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(code(o) for o in action.option_strings) or code(action.dest)
        metavar = action.metavar or (action.dest.upper() if action.option_strings else "")
        arg = "" if action.nargs == 0 else code(metavar) if metavar else ""
        rows.append((names, arg, _default(action), _help(action, parser)))
    return table(("option", "value", "default", "meaning"), rows) if rows else ""


def _section(parser: argparse.ArgumentParser, level: int) -> str:
    subs = _subcommands(parser)
    parts = [f"{'#' * level} {parser.prog}", "", f"```text\n{_usage(parser)}\n```", ""]
    if parser.description:
        parts += [md_text(parser.description), ""]
    if subs:
        parts += [
            table(
                ("command", "what it does"),
                ((f"[{code(n)}](#{_anchor(s.prog)})", md_text(h)) for n, h, s in subs),
            )
        ]
    options = _options(parser)
    if options:
        parts += [options]
    if parser.epilog:
        parts += [md_text(parser.epilog), ""]
    return "\n".join(parts)


def _anchor(prog: str) -> str:
    """Return the anchor mkdocs gives a heading ``prog`` (lower case, words joined by ``-``)."""
    return "-".join(prog.lower().replace("_", " ").split())


def render_cli(parser: argparse.ArgumentParser) -> str:
    """Return docs/reference/cli.md: every command of ``parser``, as its ``--help`` says it."""
    sections = [_section(p, 2 if p is parser else 3) for p in _walk(parser)]
    return page(
        "Command line",
        f"Every command of `{parser.prog}`, rendered from its argument parser: what "
        f"`{parser.prog} COMMAND --help` prints. `python -m exporter.doctor` and "
        "`python -m exporter.mixin` are the same commands as `ddp-exporter doctor` and "
        "`ddp-exporter mixin`.",
        *sections,
    )
