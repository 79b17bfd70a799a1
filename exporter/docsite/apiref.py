"""Write the Python API reference page from the docstrings of the public names.

The public names are those ``import exporter`` offers (its ``__all__``, loaded on first use from
the modules its ``_PUBLIC`` table names) and the framework callbacks of
:mod:`exporter.integrations`. Their signatures and docstrings are read from the source files
with :mod:`ast`, so the page is written without importing torch or any framework.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from .markdown import md_text, page

__all__ = ["PACKAGE", "public_names", "render_api"]

#: The package's source folder.
PACKAGE = Path(__file__).resolve().parents[1]

#: The framework callbacks, documented after the names of ``import exporter``:
#: (import path, source file relative to the package, class name).
CALLBACKS: tuple[tuple[str, str, str], ...] = (
    ("exporter.integrations.lightning", "integrations/lightning.py", "ExporterCallback"),
    ("exporter.integrations.transformers", "integrations/transformers.py", "ExporterCallback"),
)


#: Members of the public classes that a training script (or a framework callback) uses; the
#: rest of their methods are the package's own plumbing.
MEMBERS: dict[str, tuple[str, ...]] = {
    "Observer": ("url", "step", "close", "closed", "timed_batches", "optimizer_phase_begins"),
    "InitWatch": ("close", "closed"),
}


def _tree(rel: str) -> tuple[ast.Module, list[str]]:
    text = (PACKAGE / rel).read_text(encoding="utf-8")
    tree = ast.parse(text)
    _CONSTANTS.clear()
    _CONSTANTS.update(_constants(tree, rel))
    return tree, text.splitlines()


def public_names() -> list[tuple[str, str]]:
    """Return ``(name, source file)`` of each name ``import exporter`` offers, in its order."""
    tree, _ = _tree("__init__.py")
    exported: list[str] = []
    modules: dict[str, str] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and value is not None:
            if target.id == "__all__":
                exported = ast.literal_eval(value)
            elif target.id == "_PUBLIC":
                modules = ast.literal_eval(value)
    order = ("instrument", "watch_init", "step", "deadline", "active")
    names = [n for n in order if n in modules] + sorted(n for n in modules if n not in order)
    return [(n, modules[n].replace(".", "/") + ".py") for n in names if n in exported]


def _find(tree: ast.Module, name: str) -> ast.AST:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return node
    raise LookupError(f"{name} is not defined at the top of its module")


#: Module-level constants of the module being rendered: a default that names one shows its value.
_CONSTANTS: dict[str, str] = {}


def _constants(tree: ast.Module, rel: str) -> dict[str, str]:
    """Return the literal module-level constants of ``tree`` and those it imports from siblings."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                ast.literal_eval(node.value)
            except ValueError:
                continue
            out[node.targets[0].id] = ast.unparse(node.value)
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            sibling = Path(rel).parent / f"{node.module.replace('.', '/')}.py"
            if (PACKAGE / sibling).is_file():
                found = _constants(ast.parse((PACKAGE / sibling).read_text("utf-8")), str(sibling))
                out.update({a.name: found[a.name] for a in node.names if a.name in found})
    return out


def _param(arg: ast.arg, default: ast.expr | None) -> str:
    text = arg.arg
    if arg.annotation is not None:
        text += ": " + ast.unparse(arg.annotation)
    if default is not None:
        shown = ast.unparse(default)
        shown = _CONSTANTS.get(shown, shown)
        text += (" = " if arg.annotation is not None else "=") + shown
    return text


def _signature(node: ast.FunctionDef, shown: str) -> str:
    """Return ``def shown(...) -> ...`` of ``node``, one parameter per line when long."""
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [_param(p, d) for p, d in zip(positional, defaults)]
    if a.posonlyargs:
        params.insert(len(a.posonlyargs), "/")
    if a.vararg is not None:
        params.append("*" + _param(a.vararg, None))
    elif a.kwonlyargs:
        params.append("*")
    params += [_param(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg is not None:
        params.append("**" + _param(a.kwarg, None))
    if params and params[0] in ("self", "cls"):
        params.pop(0)
    returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
    one_line = f"{shown}({', '.join(params)}){returns}"
    if len(one_line) <= 92:
        return one_line
    inner = "".join(f"    {p},\n" for p in params)
    return f"{shown}(\n{inner}){returns}"


def _doc(node: ast.AST) -> str:
    text = (
        ast.get_docstring(node)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module))
        else None
    )
    return md_text(inspect.cleandoc(text)) if text else ""


def _comment_above(node: ast.AST, lines: list[str]) -> str:
    """Return the ``#:`` comment lines right above ``node``."""
    out: list[str] = []
    i = node.lineno - 2
    while i >= 0 and lines[i].lstrip().startswith("#:"):
        out.insert(0, lines[i].lstrip()[2:].strip())
        i -= 1
    return md_text(" ".join(out))


def _decorators(node: ast.FunctionDef) -> list[str]:
    return [ast.unparse(d) for d in node.decorator_list]


def _function(node: ast.FunctionDef, shown: str, level: int) -> str:
    decorators = _decorators(node)
    if "property" in decorators:
        head = f"{shown}  (property)"
        block = f"{shown}: {ast.unparse(node.returns)}" if node.returns is not None else shown
    else:
        head = shown + "()"
        block = "\n".join(
            [*(f"@{d}" for d in decorators if d != "staticmethod"), _signature(node, shown)]
        )
    return f"{'#' * level} `{head}`\n\n```python\n{block}\n```\n\n{_doc(node)}\n"


def _class(node: ast.ClassDef, shown: str, level: int, members: tuple[str, ...] | None) -> str:
    """Render a class: with ``members`` None its constructor, else those methods in turn."""
    bases = ", ".join(ast.unparse(b) for b in node.bases)
    out = [
        f"{'#' * level} `{shown}`\n\n```python\nclass {shown.rsplit('.', 1)[-1]}"
        f"{f'({bases})' if bases else ''}\n```\n\n{_doc(node)}\n"
    ]
    methods = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
    if members is None:
        out.append(f"```python\n{_signature(methods['__init__'], shown.rsplit('.', 1)[-1])}\n```\n")
        return "\n".join(out)
    for name in members:
        out.append(_function(methods[name], f"{shown}.{name}", level + 1))
    return "\n".join(out)


def _entry(
    node: ast.AST, lines: list[str], shown: str, level: int, members: tuple[str, ...] | None
) -> str:
    if isinstance(node, ast.FunctionDef):
        return _function(node, shown, level)
    if isinstance(node, ast.ClassDef):
        return _class(node, shown, level, members)
    value = ast.unparse(node.value) if node.value is not None else ""  # type: ignore[attr-defined]
    return f"{'#' * level} `{shown}`\n\n```python\n{shown} = {value}\n```\n\n{_comment_above(node, lines)}\n"


def render_api() -> str:
    """Return docs/reference/api.md: the public names, their signatures and docstrings."""
    sections = []
    for name, rel in public_names():
        tree, lines = _tree(rel)
        sections.append(
            _entry(_find(tree, name), lines, f"exporter.{name}", 2, MEMBERS.get(name, ()))
        )
    for module, rel, name in CALLBACKS:
        tree, lines = _tree(rel)
        intro = _doc(tree)
        sections.append(
            f"## `{module}`\n\n{intro}\n\n"
            + _entry(_find(tree, name), lines, f"{module}.{name}", 3, None)
        )
    return page(
        "Python API",
        "What a training script calls, from the docstrings of the code. `import exporter` "
        "loads these names on first use and imports no torch until then. Each keyword setting "
        "of `instrument()` and `watch_init()` can also come from the environment: see "
        "[Settings](settings.md).",
        *sections,
    )
