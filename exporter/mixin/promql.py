"""Write PromQL's string literals and check a label matcher list, so generated PromQL parses.

A label value the generator puts in an expression (a job name, a run, a cluster) may be any
string: :func:`string` quotes it. A selector the configuration adds to every expression must be
a list of label matchers as PromQL reads them: :func:`check_matchers` refuses anything else,
and a backquote, which would end the raw string an alert's template quotes it in.
"""

from __future__ import annotations

import json
import re

__all__ = ["check_matchers", "string"]


def string(value: str) -> str:
    """Return ``value`` as a double-quoted PromQL string literal (any string, escaped).

    JSON's escapes are all PromQL's (Go's); non-ASCII stays as it is, since a ``\\u`` escape of
    half a surrogate pair, as ``ensure_ascii`` writes one, is not a code point PromQL accepts.
    """
    return json.dumps(value, ensure_ascii=False)


_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_OPERATOR = r"=~|!~|!=|="
# An escape PromQL's lexer reads in a string quoted with q: Go's, octal up to \377.
_ESCAPE = (
    r"\\(?:[abfnrtv\\{q}]|x[0-9a-fA-F]{{2}}|u[0-9a-fA-F]{{4}}|U[0-9a-fA-F]{{8}}|[0-3][0-7]{{2}})"
)
_QUOTED = "|".join(rf"{q}(?:[^{q}\\\n]|{_ESCAPE.format(q=q)})*{q}" for q in ('"', "'"))
_MATCHER = re.compile(rf"\s*({_NAME})\s*({_OPERATOR})\s*({_QUOTED})\s*")
_CODE_POINT = re.compile(r"\\(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|.)")


def check_matchers(text: str) -> None:
    """Raise ValueError unless ``text`` is empty or label matchers joined by commas, such as
    ``cluster="a", env!~"dev|test"``: what goes between a selector's braces.

    A regular expression's own syntax (``=~``) is Prometheus's to judge (RE2, not Python's).
    """
    refused = ValueError(
        f'expected label matchers such as cluster="a", env!~"dev|test" (no backquote), got {text!r}'
    )
    if "`" in text:  # it would end the raw string an alert's template quotes the selector in
        raise refused
    pos = 0
    while pos < len(text):
        found = _MATCHER.match(text, pos)
        if found is None:
            raise refused
        for escape in _CODE_POINT.finditer(found.group(3)[1:-1]):
            point = int(escape.group(1) or escape.group(2) or "0", 16)
            if point > 0x10FFFF or 0xD800 <= point < 0xE000:
                raise ValueError(f"{escape.group(0)} is no Unicode code point, in {text!r}")
        pos = found.end()
        if pos < len(text) and (text[pos] != "," or pos + 1 == len(text)):
            raise refused  # a matcher ends at a comma that another follows, or at the end
        pos += 1
