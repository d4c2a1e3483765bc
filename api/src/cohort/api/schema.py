"""Turns annotated dataclasses into a structural OpenAPI schema, and parses dicts.

One field declaration carries its type, default, doc, enum (via ``Literal``)
and range. From it come: the CRD's ``openAPIV3Schema`` (with defaults, enums,
bounds and CEL rules), Python-side defaulting and validation (for manifests
that never meet an API server, e.g. ``cohort run --local``), and the API docs.

Cross-field rules are declared once as :class:`Rule`: a CEL expression for the
API server and the equivalent Python predicate beside it, so the two cannot
drift apart unnoticed (a unit test runs the invalid-manifest table against
both).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from decimal import ROUND_UP, Decimal, localcontext
from typing import Any, Literal, TypeGuard, Union, get_args, get_origin

MISSING = dataclasses.MISSING
# The API server's integers are int64: a larger number in an integer field is refused.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# The longest name of a named free-form item: a DNS label, as core/v1 volume names are. (A bound also
# keeps the CEL rules that read the names within the API server's cost budget.)
ITEM_NAME_MAX = 63


class ValidationError(ValueError):
    """A manifest or config is invalid. The message starts with the field path.

    :func:`parse` finds every problem of a document at once, as the API server does (it names every unknown
    field in one refusal): each is one of ``problems``, and the message joins them with ``"; "``.
    """

    def __init__(self, *problems: str):
        super().__init__("; ".join(problems))
        self.problems = problems


# resource.Quantity's serialised form, as in Kubernetes' own OpenAPI schema.
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")


def anchored(pattern: str) -> str:
    """``pattern`` as a match of the whole string: ``^(?:...)$``.

    The API server (like CEL's ``matches``) finds a pattern anywhere in the string, Python's
    ``fullmatch`` only as the whole: unanchored, ``mlp-v2`` passes the CRD's ``(mlp|...)`` but not
    Python's. Every pattern the schema emits and every one Python checks goes through here, so both
    sides read the same text the same way (RE2 and Python agree on ``^``, ``$`` and ``(?:...)``; with
    :func:`pattern_matches`' ``fullmatch``, Python's ``$`` cannot match before a final newline either).
    """
    inner = pattern[1:] if pattern.startswith("^") else pattern
    if inner.endswith("$") and not inner.endswith("\\$"):
        inner = inner[:-1]
    return f"^(?:{inner})$"


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    # ASCII: RE2's classes (\d, \w, \s) are ASCII-only; Python's are Unicode unless told.
    return re.compile(anchored(pattern), re.ASCII)


def pattern_matches(pattern: str, value: str) -> bool:
    """Whether the API server would admit ``value`` for a field with ``pattern``."""
    return _compiled(pattern).fullmatch(value) is not None


class Quantity(str):
    """Type marker for a Kubernetes resource.Quantity: an integer, or a string such as ``500m``, ``2Gi``,
    ``1e3``. Values stay as written (int or str); the CRD schema is int-or-string with Kubernetes' pattern."""


_SUFFIXES: dict[str, Decimal | int] = {"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
             "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity_value(q: int | str) -> Decimal:
    """The number a resource.Quantity stands for (``2Gi`` -> 2147483648, ``500m`` -> 0.5), as CEL's
    ``quantity()`` reads it. Raises ValueError on a malformed quantity."""
    if isinstance(q, int) and not isinstance(q, bool):
        return Decimal(q)
    m = re.fullmatch(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?", str(q))
    if not m:
        raise ValueError(f"not a quantity: {q!r}")
    number, suffix = m.group(1), m.group(2) or ""
    with localcontext() as exact:
        exact.prec = 400  # no rounding by the arithmetic itself, whatever the digits
        value = Decimal(number + suffix) if suffix[:1] in ("e", "E") else Decimal(number) * _SUFFIXES[suffix]
        if value == value.to_integral_value():
            return value
        # resource.ParseQuantity rounds a value finer than a nano away from zero, to the next nano.
        return value.quantize(Decimal("1e-9"), rounding=ROUND_UP)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A cross-field rule checked by the API server (CEL) and in Python."""

    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str | None = None  # CEL fieldPath, relative to the object


def field(
    default: Any = MISSING,
    *,
    doc: str,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    pattern: str | None = None,
    pattern_message: str | None = None,
    free_form: bool = False,
    named: bool = False,
    strings: Mapping[str, int] | None = None,
    max_items: int | None = None,
    strict: bool = True,
) -> Any:
    """Declare a model field. Mutable defaults are copied per instance.

    ``free_form`` marks an object whose contents Kubernetes or the user own
    (resources, affinity, modelArgs): kept as-is and not validated here.
    ``named`` (a free-form list) declares its items' ``name``: a required string of at most
    :data:`ITEM_NAME_MAX` characters, which CEL rules can then read (core/v1 volumes, mounts).
    ``strings`` (a free-form list) declares more of its items' string fields, optional, each with its
    longest length (or the name's, in place of :data:`ITEM_NAME_MAX`): CEL rules can read them too.
    ``max_items`` bounds a list (the API server's CEL cost estimate needs bounds on what a rule iterates).
    """
    meta = {
        "doc": doc,
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "pattern": pattern,
        "pattern_message": pattern_message,
        "free_form": free_form,
        "named": named,
        "strings": dict(strings or {}),
        "max_items": max_items,
    }
    if isinstance(default, (dict, list)):
        frozen = copy.deepcopy(default)
        return dataclasses.field(default_factory=lambda: copy.deepcopy(frozen), metadata=meta)
    if dataclasses.is_dataclass(default) and isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# --- type helpers -----------------------------------------------------------

def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0], True
    return tp, False


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    # Cached: resolving annotations is slow, and the operator parses every job on every reconcile.
    return typing.get_type_hints(cls, include_extras=False)


def is_model(tp: Any) -> TypeGuard[type[Any]]:
    """True for a model class (a dataclass type, not an instance)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _json_default(value: Any) -> Any:
    # An absent section defaults to its fully-defaulted value, so CEL rules on
    # it see every field (the API server validates defaults against the rules).
    return to_dict(value)


# --- schema generation ------------------------------------------------------

def openapi_schema(cls: type, *, description: str | None = None) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a model dataclass."""
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        name = f.name
        fs = _type_schema(hints[name], f.metadata)
        fs["description"] = f.metadata.get("doc", "")
        default = _default_of(f)
        if default is MISSING:
            required.append(_json_name(name))
        elif default is not None:
            fs["default"] = _json_default(default)
        props[_json_name(name)] = fs
    schema: dict[str, Any] = {"type": "object", "properties": props}
    doc = description or (cls.__doc__ or "").strip().split("\n\n")[0]
    if doc:
        schema["description"] = " ".join(doc.split())
    if required:
        schema["required"] = required
    rules = getattr(cls, "__rules__", ())
    if rules:
        schema["x-kubernetes-validations"] = [_rule_schema(r) for r in rules]
    return schema


def _rule_schema(rule: Rule) -> dict[str, Any]:
    out = {"rule": rule.cel, "message": rule.message}
    if rule.field_path:
        out["fieldPath"] = rule.field_path
    return out


def _type_schema(tp: Any, meta: typing.Mapping[str, Any]) -> dict[str, Any]:
    tp, nullable = _unwrap_optional(tp)
    s: dict[str, Any]
    origin = get_origin(tp)
    if is_model(tp):
        s = openapi_schema(tp)
        s.pop("description", None)
    elif origin is Literal:
        values = list(get_args(tp))
        s = {"type": "string", "enum": values}
    elif tp is bool:
        s = {"type": "boolean"}
    elif tp is int:
        s = {"type": "integer"}
    elif tp is float:
        s = {"type": "number"}
    elif tp is str:
        s = {"type": "string"}
    elif tp is Quantity:
        s = {"anyOf": [{"type": "integer"}, {"type": "string"}], "pattern": QUANTITY_PATTERN,
             "x-kubernetes-int-or-string": True}
    elif origin is dict or tp is dict:
        args = get_args(tp)
        if meta.get("free_form") or not args or args[1] is Any:
            s = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        else:
            s = {"type": "object", "additionalProperties": _type_schema(args[1], {})}
    elif origin is list:
        (item,) = get_args(tp)
        if item is Any or meta.get("free_form"):
            item_s = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            if declared := _item_strings(meta):
                item_s["properties"] = {k: {"type": "string", "maxLength": n} for k, n in declared.items()}
            if meta.get("named"):
                item_s["required"] = ["name"]
        else:
            item_s = _type_schema(item, {})
        s = {"type": "array", "items": item_s}
        if meta.get("max_items") is not None:
            s["maxItems"] = meta["max_items"]
    else:
        raise TypeError(f"unsupported model type {tp!r}")
    if meta.get("minimum") is not None:
        s["minimum"] = meta["minimum"]
        if meta.get("exclusive_minimum"):
            s["exclusiveMinimum"] = True
    if meta.get("maximum") is not None:
        s["maximum"] = meta["maximum"]
    if meta.get("pattern"):
        s["pattern"] = meta["pattern"]
    if "pattern" in s:  # the one place a pattern enters the schema: anchored, whoever declared it
        s["pattern"] = anchored(s["pattern"])
    if nullable:
        s["nullable"] = True
    return s


def _json_name(py_name: str) -> str:
    head, *rest = py_name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


# --- parsing, defaulting, validation -----------------------------------------

T = typing.TypeVar("T")


def parse(cls: type[T], data: Any, path: str = "spec") -> T:
    """Build a model from a dict, applying defaults and every validation.

    Unknown keys are refused (a likely typo), except inside free-form fields.
    Raises :class:`ValidationError` whose message starts with the field path.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValidationError(f"{path}: must be an object, got {type(data).__name__}")
    hints = _hints(typing.cast(type, cls))
    by_json = {_json_name(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known = ", ".join(sorted(by_json))
    problems = [f"{path}.{name}: unknown field (known: {known})" for name in sorted(set(data) - set(by_json))]
    kwargs = {}
    for jname, f in by_json.items():
        fpath = f"{path}.{jname}"
        value = data.get(jname, MISSING)
        if value is None and not _unwrap_optional(hints[f.name])[1]:
            # The API server prunes a null it may not store (the field is not nullable) before
            # defaulting: the field is then absent, defaulted or missing. So is it here.
            value = MISSING
        if value is not MISSING:
            try:
                kwargs[f.name] = _parse_value(hints[f.name], f.metadata, value, fpath)
            except ValidationError as e:
                problems += e.problems
        elif _default_of(f) is MISSING:
            problems.append(f"{fpath}: required field is missing")
    if problems:  # the object's rules read its fields: not evaluated on fields that were refused
        raise ValidationError(*problems)
    obj = cls(**kwargs)
    for rule, dotted in _integers_read_by_rules(typing.cast(Any, cls)):
        raw = _lookup(data, dotted)
        if isinstance(raw, float) and _depends_on(rule, obj, dotted):
            # The API server keeps 2.0 as a float; a CEL rule whose result needs an integer field then
            # fails on it ("is of the type float64, expected int64") and refuses the object. Where the
            # rule's result does not need it (``a || b`` with ``a`` true), CEL absorbs the error.
            problems.append(f"{path}.{dotted}: must be an integer without a fraction point (a rule reads it), "
                            f"got {raw!r}")
    for dotted, key in _quantities_read_by_rules(typing.cast(Any, cls)):
        raw = _lookup(data, dotted)
        if isinstance(raw, dict) and isinstance(raw.get(key), float):
            # JSON 1.0 stays a float in an int-or-string map, and CEL cannot read that ("expected XIntOrString
            # value to be either a string or integer"): the API server refuses the object.
            problems.append(f"{path}.{dotted}: {key} must be an integer or a string such as \"1\" (a rule reads "
                            f"it), got {raw[key]!r}")
    if problems:
        raise ValidationError(*problems)
    problems = [f"{path}{rule.field_path or ''}: {rule.message}"
                for rule in getattr(cls, "__rules__", ()) if not _holds(rule, obj)]
    if problems:
        raise ValidationError(*problems)
    return obj


def _chain_type(cls: type, names: list[str]) -> Any:
    """The type of the field at a dotted JSON path of model fields from ``cls``; None where the path leaves them."""
    tp: Any = cls
    for name in names:
        fields = {_json_name(f.name): f for f in dataclasses.fields(tp)} if is_model(tp) else {}
        if name not in fields:
            return None
        tp = _unwrap_optional(_hints(typing.cast(Any, tp))[fields[name].name])[0]
    return tp


@functools.cache
def _integers_read_by_rules(cls: type) -> tuple[tuple[Rule, str], ...]:
    """Each rule of ``cls`` with an integer field its CEL reads (a dotted JSON path from ``cls``)."""
    found: list[tuple[Rule, str]] = []
    for rule in getattr(cls, "__rules__", ()):
        if "oldSelf" in rule.cel:
            continue  # a transition rule: not evaluated when an object is created
        for chain in re.findall(r"(?<![\w.])self((?:\.\w+)+)", rule.cel):
            names = chain.lstrip(".").split(".")
            if _chain_type(cls, names) is int:
                found.append((rule, ".".join(names)))
    return tuple(dict.fromkeys(found))


@functools.cache
def _quantities_read_by_rules(cls: type) -> tuple[tuple[str, str], ...]:
    """Each map entry of quantities a rule of ``cls`` reads by its key (``self.requests['nvidia.com/gpu']``),
    as (the map's dotted JSON path from ``cls``, the key)."""
    found: list[tuple[str, str]] = []
    for rule in getattr(cls, "__rules__", ()):
        for chain, key in re.findall(r"(?<![\w.])self((?:\.\w+)+)\['([^']+)'\]", rule.cel):
            tp = _chain_type(cls, chain.lstrip(".").split("."))
            if typing.get_origin(tp) is dict and get_args(tp)[1] is Quantity:
                found.append((chain.lstrip("."), key))
    return tuple(dict.fromkeys(found))


def _holds(rule: Rule, obj: Any) -> bool:
    """Whether the object meets the rule; one whose predicate fails on it does not (in CEL, an evaluation error
    refuses the object too)."""
    try:
        return bool(rule.check(obj))
    except Exception:  # e.g. a predicate that assumes another rule held
        return False


def _depends_on(rule: Rule, obj: Any, dotted: str) -> bool:
    """Whether the rule's result changes with the integer at ``dotted`` (then CEL must read it)."""
    results = set()
    for probe in (0, 1, -1, 2, 2**62, -(2**62)):
        try:
            results.add(bool(rule.check(_replaced(obj, dotted.split("."), probe))))
        except Exception:  # a predicate that cannot take the probe: CEL would need the field too
            return True
    return len(results) > 1


def _replaced(obj: Any, names: list[str], value: Any) -> Any:
    fields = {_json_name(f.name): f.name for f in dataclasses.fields(obj)}
    name = fields[names[0]]
    inner = value if len(names) == 1 else _replaced(getattr(obj, name), names[1:], value)
    return dataclasses.replace(obj, **{name: inner})


def _lookup(data: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data


def _parse_value(tp: Any, meta: typing.Mapping[str, Any], value: Any, path: str) -> Any:
    tp, nullable = _unwrap_optional(tp)
    origin = get_origin(tp)
    if value is None:
        if nullable and origin is not Literal:
            return None
        # The API server checks a null against a nullable field's enum too, and refuses it ("Unsupported
        # value: null"), even with null among the enum's values (measured 2026-12-05): so does Python.
        raise ValidationError(f"{path}: must not be null" + (" (leave the field out to unset it)" if nullable else ""))
    if is_model(tp):
        return parse(tp, value, path)
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ValidationError(
                f"{path}: unsupported value {value!r}; supported values: {', '.join(map(str, allowed))}")
        return value
    if tp is bool:
        _check_type(value, bool, path, "boolean")
    elif tp is int:
        value = _whole(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(f"{path}: must be an integer, got {value!r}")
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValidationError(f"{path}: must be a 64-bit integer, got {value!r}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValidationError(f"{path}: must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):  # JSON has no infinity or NaN: no API server would see one
            raise ValidationError(f"{path}: must be a finite number, got {value!r}")
    elif tp is str:
        _check_type(value, str, path, "string")
    elif tp is Quantity:
        value = _whole(value)
        if isinstance(value, bool) or not isinstance(value, (int, str)) or (
                isinstance(value, str) and not pattern_matches(QUANTITY_PATTERN, value)):
            raise ValidationError(f"{path}: must be a quantity (an integer, or e.g. 500m, 2Gi, 1.5), got {value!r}")
        return value
    elif origin is dict or tp is dict:
        _check_type(value, dict, path, "object")
        args = get_args(tp)
        if meta.get("free_form") or not args or args[1] is Any:
            return copy.deepcopy(value)
        # A null value the map's type may not hold is pruned by the API server, as a null field is.
        keep_null = _unwrap_optional(args[1])[1]
        return _each({k: v for k, v in value.items() if v is not None or keep_null},
                     lambda k, v: _parse_value(args[1], {}, v, f"{path}.{k}"))
    elif origin is list:
        _check_type(value, list, path, "array")
        if meta.get("max_items") is not None and len(value) > meta["max_items"]:
            raise ValidationError(f"{path}: must have at most {meta['max_items']} items, got {len(value)}")
        (item,) = get_args(tp)
        if item is Any or meta.get("free_form"):
            declared = _item_strings(meta)
            for i, v in enumerate(value):  # the schema's items are objects (core/v1 ones): contents unchecked
                _check_type(v, dict, f"{path}[{i}]", "object")
                if meta.get("named") and v.get("name") is None:
                    raise ValidationError(f"{path}[{i}].name: required field is missing")
                for key, longest in declared.items():
                    _check_item_string(v.get(key), longest, f"{path}[{i}].{key}")
            # A null in a declared field is pruned by the API server (one in an undeclared field is kept).
            return [{k: copy.deepcopy(x) for k, x in v.items() if x is not None or k not in declared} for v in value]
        return list(_each(dict(enumerate(value)), lambda i, v: _parse_value(item, {}, v, f"{path}[{i}]")).values())
    _check_bounds(value, meta, path)
    return value


def _each(items: dict[Any, Any], parse_one: Callable[[Any, Any], Any]) -> dict[Any, Any]:
    """Each item parsed; every item's problems at once."""
    out: dict[Any, Any] = {}
    problems: list[str] = []
    for key, value in items.items():
        try:
            out[key] = parse_one(key, value)
        except ValidationError as e:
            problems += e.problems
    if problems:
        raise ValidationError(*problems)
    return out


def _item_strings(meta: Mapping[str, Any]) -> dict[str, int]:
    """The declared string fields of a free-form list's items, and their longest lengths."""
    return ({"name": ITEM_NAME_MAX} if meta.get("named") else {}) | dict(meta.get("strings") or {})


def _check_item_string(value: Any, longest: int, path: str) -> None:
    if value is None:  # absent (a null is pruned by the API server, as elsewhere)
        return
    _check_type(value, str, path, "string")
    if len(value) > longest:
        raise ValidationError(f"{path}: must be at most {longest} characters, got {len(value)}")


def _whole(value: Any) -> Any:
    """A float with no fraction as the int the API server stores for it (JSON ``2.0`` in an integer field is 2)."""
    if isinstance(value, float) and value.is_integer() and INT64_MIN <= value <= INT64_MAX:
        return int(value)
    return value


def _check_type(value: Any, tp: type, path: str, name: str) -> None:
    if not isinstance(value, tp):
        raise ValidationError(f"{path}: must be a {name}, got {value!r}")


def _check_bounds(value: Any, meta: typing.Mapping[str, Any], path: str) -> None:
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if lo is not None:
        if meta.get("exclusive_minimum") and not value > lo:
            raise ValidationError(f"{path}: must be greater than {lo}, got {value}")
        if not meta.get("exclusive_minimum") and not value >= lo:
            raise ValidationError(f"{path}: must be at least {lo}, got {value}")
    if hi is not None and not value <= hi:
        raise ValidationError(f"{path}: must be at most {hi}, got {value}")
    pattern = meta.get("pattern")
    if pattern and not pattern_matches(pattern, value):
        raise ValidationError(f"{path}: {meta.get('pattern_message') or 'must match ' + pattern}, got {value!r}")


def to_dict(obj: Any, *, omit_none: bool = False) -> Any:
    """A model as the JSON-shaped dict the API server would store (camelCase).

    ``omit_none`` leaves out model fields that are None (an unset nullable field, which the API
    server stores as absent); without it they are written as null (a status patch clears them),
    except an unset enum field: the API server refuses a null enum value (and so does ``parse``),
    so it is always left out, and ``parse(to_dict(x))`` gives ``x`` back.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        hints = _hints(type(obj))
        fields = ((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj))
        return {_json_name(name): to_dict(value, omit_none=omit_none) for name, value in fields
                if not (value is None and (omit_none or get_origin(_unwrap_optional(hints[name])[0]) is Literal))}
    if isinstance(obj, list):
        return [to_dict(v, omit_none=omit_none) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v, omit_none=omit_none) for k, v in obj.items()}
    return obj
