"""Encode and decode the hang protocol's values from their fields' types, as SHAPES says.

A field is read by its type: ``str``, ``int`` and ``bool`` by their constructors (``str()`` of
whatever was written, ``int("7")``), a ``float`` as the number it was written as (36 stays 36),
a tuple from a list and a mapping from an object (null or empty reads as empty), a protocol
value from its object (or list, :attr:`Shape.listed`), ``Any`` as it is. ``X | None`` reads null
as None, and a protocol value (or a fixed tuple) that is empty as None too; a list or object
under ``| None`` is read strictly (only null is none). The readers and writers of each type are
built once, on first use.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union, cast

from .shapes import PLAIN, SHAPES

__all__ = ["JSON", "Raw", "decode", "encode", "from_dict", "load", "to_dict"]

_T = TypeVar("_T")
Raw = str | bytes | bytearray
JSON = dict[str, Any]
_Convert = Callable[[Any], Any]


def load(raw: Raw) -> JSON:
    """Return the JSON object ``raw`` holds (ValueError when it holds something else)."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    return data


def to_dict(value: Any) -> JSON:
    """Return a protocol value as the JSON object it travels as."""
    return cast(JSON, _to_json(value))


def from_dict(cls: type[_T], m: Mapping[str, Any]) -> _T:
    """Read a value of ``cls`` from its JSON object (KeyError: a required field is absent)."""
    return cast(_T, _from_json(cls, m))


def encode(value: Any) -> str:
    """Return a protocol value as the string that travels through the store."""
    return json.dumps(_to_json(value))


def decode(cls: type[_T], raw: Raw) -> _T:
    """Read a value of ``cls`` from the store's string (or bytes)."""
    return from_dict(cls, load(raw))


# -- one field --------------------------------------------------------------------------------------
_ABSENT = object()


@dataclasses.dataclass(frozen=True)
class _Field:
    """One field of a class as the codec reads and writes it."""

    name: str
    key: str
    read: _Convert
    write: _Convert
    #: What an absent field reads as (None: it is required).
    absent: Callable[[], Any] | None
    #: The class has a default for it (a list may end before it).
    optional: bool
    #: A false value reads as an absent one.
    blank: bool
    #: Says whether to leave it out.
    omit: Callable[[Any], bool]
    #: Its keys are the enclosing value's own.
    merged: bool


def _field(cls: type, f: dataclasses.Field[Any], tp: Any) -> _Field:
    shape = SHAPES.get(cls, PLAIN)
    read, write = _reader(tp, f.name in shape.strict), _writer(tp)
    if f.name in shape.lenient:
        read = _lenient(read)
    if f.name in shape.rounded:
        write = functools.partial(round, ndigits=shape.rounded[f.name])
    default: Callable[[], Any] | None = None
    if f.default is not dataclasses.MISSING:
        default = functools.partial(_same, f.default)
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory
    absent = default
    if f.name in shape.reads:
        absent = functools.partial(read, shape.reads[f.name])  # read as if it had been written
    omit: Callable[[Any], bool] = _never
    if f.name in shape.omit:
        omit = _is_none if f.default is None else operator.not_
    return _Field(
        f.name,
        shape.keys.get(f.name, f.name),
        read,
        write,
        absent,
        default is not None,
        f.name in shape.blank,
        omit,
        f.name == shape.merged,
    )


@functools.cache
def _fields(cls: type) -> tuple[_Field, ...]:
    """Return the fields of ``cls`` in the order they are read (the class's)."""
    hints = typing.get_type_hints(cls)
    return tuple(_field(cls, f, hints[f.name]) for f in dataclasses.fields(cls))


@functools.cache
def _written(cls: type) -> tuple[_Field, ...]:
    """Return the fields of ``cls`` in the order they are written."""
    fields, order = _fields(cls), SHAPES.get(cls, PLAIN).order
    if not order:
        return fields
    by_name = {f.name: f for f in fields}
    if sorted(order) != sorted(by_name):
        raise TypeError(f"the order of {cls.__name__} must name each of its fields once")
    return tuple(by_name[name] for name in order)


def _value(f: _Field, v: Any) -> Any:
    """Return field ``f`` read from ``v`` (:data:`_ABSENT`: not there)."""
    if v is _ABSENT or (f.blank and not v):
        if f.absent is None:
            raise KeyError(f.key)
        return f.absent()
    return f.read(v)


# -- one value ---------------------------------------------------------------------------------------
def _from_json(cls: type, m: Any) -> Any:
    fields = _fields(cls)
    if SHAPES.get(cls, PLAIN).listed:
        return _from_list(cls, fields, m)
    # Fields are asked for with .get, as the readers always did (what is not an object raises
    # AttributeError), but where every field is required: those are subscripted (TypeError).
    if all(f.absent is None for f in fields):
        return cls(**{f.name: f.read(m[f.key]) for f in fields})
    return cls(
        **{f.name: f.read(m) if f.merged else _value(f, m.get(f.key, _ABSENT)) for f in fields}
    )


def _from_list(cls: type, fields: tuple[_Field, ...], v: Any) -> Any:
    values = list(v)
    least = sum(not f.optional for f in fields)
    if len(values) < least or (SHAPES[cls].closed and len(values) > len(fields)):
        raise ValueError(f"{cls.__name__} needs {least} values, got {len(values)}")
    return cls(**{f.name: _value(f, x) for f, x in zip(fields, values)})


def _to_json(value: Any) -> Any:
    cls: type = type(value)
    if SHAPES.get(cls, PLAIN).listed:
        pairs = [(f, getattr(value, f.name)) for f in _fields(cls)]
        while pairs and pairs[-1][0].omit(pairs[-1][1]):
            pairs.pop()
        return [f.write(v) for f, v in pairs]
    out: JSON = {}
    for f in _written(cls):
        v = getattr(value, f.name)
        if f.omit(v):
            continue
        if f.merged:
            out.update(f.write(v))
        else:
            out[f.key] = f.write(v)
    return out


# -- one type ----------------------------------------------------------------------------------------
def _same(value: Any) -> Any:
    return value


def _never(value: Any) -> bool:
    return False


def _is_none(value: Any) -> bool:
    return value is None


def _num(value: Any) -> float:
    """Return a JSON number as read (an int stays an int); refuse anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return float(value)  # a numeric string still reads; None or a list raises TypeError
    return value


def _lenient(read: _Convert) -> _Convert:
    def lenient(value: Any) -> Any:
        try:
            return read(value)
        except (TypeError, ValueError):
            return None

    return lenient


def _fixed(tp: Any) -> bool:
    """Say whether ``tp`` is a tuple of fixed length (``tuple[str, str, float]``)."""
    return typing.get_origin(tp) is tuple and typing.get_args(tp)[1:] != (Ellipsis,)


def _optional(tp: Any) -> Any:
    """Return ``X`` of ``X | None``, else None."""
    if typing.get_origin(tp) not in (Union, types.UnionType):
        return None
    (inner,) = (a for a in typing.get_args(tp) if a is not type(None))
    return inner


@functools.cache
def _reader(tp: Any, strict: bool = False) -> _Convert:
    """Return the function that reads a value of type ``tp`` from JSON."""
    origin, args, inner = typing.get_origin(tp), typing.get_args(tp), _optional(tp)
    if inner is not None:
        read = _reader(inner, True)
        if _fixed(inner) or dataclasses.is_dataclass(inner):  # an empty one is none too
            return lambda v: read(v) if v else None
        return lambda v: None if v is None else read(v)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return functools.partial(_from_json, tp)
    if _fixed(tp):
        items = tuple(_reader(a) for a in args)
        return lambda v: tuple(read(v[i]) for i, read in enumerate(items))
    if origin is tuple:
        item = _reader(args[0])
        if strict:
            return lambda v: tuple(item(x) for x in v)
        return lambda v: tuple(item(x) for x in v or ())
    if origin is Mapping and args[1] is Any:
        return _same if strict else lambda v: v or {}  # opaque: the Flight Recorder's report
    if origin is Mapping:
        key, value = _reader(args[0]), _reader(args[1])
        if strict:
            return lambda v: {key(k): value(x) for k, x in v.items()}
        return lambda v: {key(k): value(x) for k, x in (v or {}).items()}
    if tp is Any:
        return _same
    if tp is float:
        return _num
    if tp in (str, int, bool):
        return cast(_Convert, tp)
    raise TypeError(f"the hang codec cannot read {tp!r}")


@functools.cache
def _writer(tp: Any) -> _Convert:
    """Return the function that writes a value of type ``tp`` as JSON."""
    origin, args, inner = typing.get_origin(tp), typing.get_args(tp), _optional(tp)
    if inner is not None:
        write = _writer(inner)
        return lambda v: None if v is None else write(v)
    if dataclasses.is_dataclass(tp):
        return _to_json
    if _fixed(tp):
        items = tuple(_writer(a) for a in args)
        return lambda v: [write(x) for write, x in zip(items, v)]
    if origin is tuple:
        item = _writer(args[0])
        return lambda v: [item(x) for x in v]
    if origin is Mapping and args[1] is not Any:
        value = _writer(args[1])
        return lambda v: {str(k): value(x) for k, x in v.items()}
    return _same
