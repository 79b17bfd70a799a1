"""Write the Markdown of the generated documentation pages: docstring text, tables, headers."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..mixin.render import GENERATED_BY

__all__ = ["cell", "code", "md_text", "page", "table"]

#: ``:func:`x``` and friends (Sphinx roles), with an optional ``~`` that keeps the last name.
_ROLE = re.compile(r":(?:func|mod|data|class|meth|attr|exc|obj):`(~?)([^`]+)`")
#: ``text`` (reStructuredText inline literal).
_LITERAL = re.compile(r"``(.+?)``")
#: A span between single backticks (Markdown code) or the text between such spans.
_SPANS = re.compile(r"(`[^`]*`)")


def _role(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


def md_text(text: str) -> str:
    """Return docstring or comment ``text`` as Markdown: roles and literals become code spans.

    Angle brackets outside code spans are escaped, so that ``<host>`` reads as text, not HTML.
    """
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(lambda m: f"`{m.group(1)}`", text)
    parts = _SPANS.split(text)
    return "".join(
        p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts
    )


def code(value: object) -> str:
    """Return ``value`` as an inline code span (empty text as an empty string's repr)."""
    text = str(value)
    if text == "":
        return '`""`'
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def cell(text: str) -> str:
    """Return ``text`` fit for one table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Return a Markdown table of ``rows`` under ``headers`` (cells already Markdown)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def page(title: str, intro: str, *sections: str) -> str:
    """Return a whole page: the do-not-edit comment, the title, the intro and the sections."""
    body = "\n".join(s.rstrip("\n") + "\n" for s in sections)
    return f"<!-- {GENERATED_BY} -->\n\n# {title}\n\n{intro.strip()}\n\n{body}"
