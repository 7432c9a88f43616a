"""A dataclass field's form in a trace, from its type annotation: how it is written as JSON, read back
and checked as it is read. So a field added to a snapshot dataclass needs no line in the trace code.

    int -> a count (>= 0)         float -> a number (>= 0)      str, bool -> themselves
    X | None -> X or null         tuple[X, ...] -> a list        tuple[X, Y] -> a list of two
    a str Enum -> its value       a dataclass -> its fields' values, in order (an older trace's list
                                  may lack the last ones: they take their defaults)

A type with no form here raises TypeError when the codec is imported, naming the field.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from batchtop.core_engine.trace.checks import (MAX_WORK, Check, boolean, entries, integer, list_of, number, one_of,
                                               optional, text)


def _same(v: object) -> object:
    return v


@dataclass(frozen=True)
class FieldType:
    encode: Callable[[object], object]  # the value as JSON
    decode: Callable[[object], object]  # back from JSON (checked already)
    check: Check


COUNT = FieldType(_same, _same, integer(0))
NUMBER = FieldType(_same, _same, number(0.0, MAX_WORK))
TEXT = FieldType(_same, _same, text)
BOOL = FieldType(_same, _same, boolean)


def field_type(tp: object, where: str = "") -> FieldType:
    """The trace form of a resolved annotation (typing.get_type_hints); `where` names it in errors."""
    if tp is bool:
        return BOOL
    if tp is int:
        return COUNT
    if tp is float:
        return NUMBER
    if tp is str:
        return TEXT
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union) and len(args) == 2 and type(None) in args:
        inner = field_type(next(a for a in args if a is not type(None)), where)
        return FieldType(lambda v: None if v is None else inner.encode(v),
                         lambda v: None if v is None else inner.decode(v), optional(inner.check))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = field_type(args[0], where)
        return FieldType(lambda v: [item.encode(x) for x in v], lambda v: tuple(item.decode(x) for x in v),
                         list_of(item.check))
    if origin is tuple and args and Ellipsis not in args:
        items = [field_type(a, where) for a in args]
        return FieldType(lambda v: [t.encode(x) for t, x in zip(items, v)],
                         lambda v: tuple(t.decode(x) for t, x in zip(items, v)),
                         entries([t.check for t in items], len(items)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum) and issubclass(tp, str):
        return FieldType(lambda v: v.value, tp, one_of(tuple(m.value for m in tp)))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return record_type(tp)
    raise TypeError(f"{where or tp}: a {tp} has no form in a trace (see core_engine/trace/field_types.py)")


@cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def type_of(cls: type, name: str) -> FieldType:
    """The trace form of one field of a dataclass."""
    return field_type(_hints(cls)[name], f"{cls.__name__}.{name}")


def has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def default_of(f: dataclasses.Field) -> object:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def required_count(cls: type) -> int:
    """How many leading fields have no default: a list form shorter than this cannot be read."""
    fields = dataclasses.fields(cls)
    return next((i for i, f in enumerate(fields) if has_default(f)), len(fields))


def record_type(cls: type, at_least: int | None = None) -> FieldType:
    """A dataclass as the list of its fields' values in order ("as Counters": a field added at the end
    is written at once, and an older trace's shorter list reads with its default). at_least: the
    shortest list any trace holds (default: the fields without a default)."""
    names = [f.name for f in dataclasses.fields(cls)]
    types_ = {n: type_of(cls, n) for n in names}
    shortest = required_count(cls) if at_least is None else at_least
    return FieldType(lambda v: [types_[n].encode(getattr(v, n)) for n in names],
                     lambda v: cls(*(types_[n].decode(x) for n, x in zip(names, v))),
                     entries([types_[n].check for n in names], shortest))
