"""Checking an OpenAI request body field by field, with the error list Triton's frontend answers.

Triton's OpenAI frontend validates bodies with pydantic models of the OpenAI schema (unknown
fields forbidden) and FastAPI answers a failure with 422 and `{"detail": [{"type", "loc",
"msg", "input", ...}]}`; clients and tests read `detail[0]["msg"]`. The same checks are
written here as small functions over the parsed JSON, so the frontend needs no pydantic, and
each error carries pydantic's type and words.

Unlike pydantic, checking stops after MAX_ERRORS errors and each error's `input` is cut short
(left out for `missing`): a large body full of mistakes answers a small 422.
"""
from __future__ import annotations

from typing import Any, Callable

MAX_ERRORS = 10          # errors reported for one body; checking stops there
MAX_INPUT_CHARS = 64     # of a string `input` in an error
MAX_INPUT_ITEMS = 4      # of a list or object `input` in an error, at each level

Loc = tuple[Any, ...]
Check = Callable[[Any, Loc], list[dict]]      # the errors of a value at a location (none: valid)


class ValidationFailed(Exception):
    """The body does not match the schema: answered 422 with `errors` as the detail."""

    def __init__(self, errors: list[dict]) -> None:
        super().__init__(errors[0]["msg"] if errors else "invalid request")
        self.errors = errors


def _clip(value: Any, depth: int = 2) -> Any:
    """`value` cut short for an error's `input`: a few items of a few levels, the start of a string."""
    if isinstance(value, str):
        return value if len(value) <= MAX_INPUT_CHARS else value[:MAX_INPUT_CHARS] + "..."
    if isinstance(value, (list, dict)) and depth <= 0:
        return "..."
    if isinstance(value, list):
        return [_clip(x, depth - 1) for x in value[:MAX_INPUT_ITEMS]] + (["..."] if len(value) > MAX_INPUT_ITEMS
                                                                          else [])
    if isinstance(value, dict):
        items = list(value.items())[:MAX_INPUT_ITEMS]
        return {k: _clip(x, depth - 1) for k, x in items} | ({"...": "..."} if len(value) > MAX_INPUT_ITEMS else {})
    return value


def error(kind: str, loc: Loc, msg: str, value: Any, ctx: dict | None = None) -> dict:
    e = {"type": kind, "loc": ["body", *loc], "msg": msg}
    if kind != "missing":
        e["input"] = _clip(value)
    if ctx:
        e["ctx"] = ctx
    return e


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _bounds(value: float, loc: Loc, ge: float | None, le: float | None) -> list[dict]:
    if ge is not None and value < ge:
        return [error("greater_than_equal", loc, f"Input should be greater than or equal to {_bound(ge)}", value,
                      {"ge": ge})]
    if le is not None and value > le:
        return [error("less_than_equal", loc, f"Input should be less than or equal to {_bound(le)}", value,
                      {"le": le})]
    return []


def integer(ge: int | None = None, le: int | None = None) -> Check:
    def check(v: Any, loc: Loc) -> list[dict]:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, float):
            return [error("int_from_float", loc, "Input should be a valid integer, got a number with a fractional "
                                                 "part", v)]
        if isinstance(v, bool) or not isinstance(v, int):
            return [error("int_type", loc, "Input should be a valid integer", v)]
        return _bounds(v, loc, ge, le)
    return check


def number(ge: float | None = None, le: float | None = None) -> Check:
    def check(v: Any, loc: Loc) -> list[dict]:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return [error("float_type", loc, "Input should be a valid number", v)]
        return _bounds(v, loc, ge, le)
    return check


def boolean(v: Any, loc: Loc) -> list[dict]:
    if isinstance(v, bool):
        return []
    return [error("bool_parsing" if isinstance(v, (int, str)) else "bool_type", loc,
                  "Input should be a valid boolean" + (", unable to interpret input" if isinstance(v, (int, str))
                                                       else ""), v)]


def string(v: Any, loc: Loc) -> list[dict]:
    return [] if isinstance(v, str) else [error("string_type", loc, "Input should be a valid string", v)]


def mapping(v: Any, loc: Loc) -> list[dict]:
    return [] if isinstance(v, dict) else [error("dict_type", loc, "Input should be a valid dictionary", v)]


def list_of(item: Check, min_length: int = 0, max_length: int | None = None) -> Check:
    def check(v: Any, loc: Loc) -> list[dict]:
        if not isinstance(v, list):
            return [error("list_type", loc, "Input should be a valid list", v)]
        if len(v) < min_length:
            return [error("too_short", loc, f"List should have at least {min_length} item after validation, not "
                                            f"{len(v)}", v, {"field_type": "List", "min_length": min_length,
                                                             "actual_length": len(v)})]
        if max_length is not None and len(v) > max_length:
            return [error("too_long", loc, f"List should have at most {max_length} items after validation, not "
                                           f"{len(v)}", v, {"field_type": "List", "max_length": max_length,
                                                            "actual_length": len(v)})]
        errors: list[dict] = []
        for i, x in enumerate(v):
            errors += item(x, (*loc, i))
            if len(errors) >= MAX_ERRORS:
                break
        return errors
    return check


def either(*branches: tuple[str, Check]) -> Check:
    """A union: valid when one branch is; otherwise every branch's errors, each under its name."""
    def check(v: Any, loc: Loc) -> list[dict]:
        errors = []
        for name, branch in branches:
            found = branch(v, (*loc, name))
            if not found:
                return []
            errors += found
        return errors
    return check


def literal(*allowed: str) -> Check:
    def check(v: Any, loc: Loc) -> list[dict]:
        if v in allowed:
            return []
        words = " or ".join(f"'{a}'" for a in allowed)
        return [error("literal_error", loc, f"Input should be {words}", v, {"expected": words})]
    return check


def anything(v: Any, loc: Loc) -> list[dict]:
    return []


class Field:
    __slots__ = ("check", "required", "nullable")

    def __init__(self, check: Check, required: bool = False, nullable: bool = True) -> None:
        self.check = check
        self.required = required
        self.nullable = nullable


def obj(fields: dict[str, Field], extra: bool = False) -> Check:
    """An object of these fields; other keys are refused unless `extra`."""
    def check(v: Any, loc: Loc) -> list[dict]:
        if not isinstance(v, dict):
            return [error("model_attributes_type", loc, "Input should be a valid dictionary or object to extract "
                                                         "fields from", v)]
        errors: list[dict] = []
        for name, f in fields.items():
            if len(errors) >= MAX_ERRORS:
                return errors
            if name not in v:
                if f.required:
                    errors.append(error("missing", (*loc, name), "Field required", v))
            elif v[name] is None:
                if not f.nullable:
                    errors += f.check(None, (*loc, name))
            else:
                errors += f.check(v[name], (*loc, name))
        if not extra:
            for k, x in v.items():
                if len(errors) >= MAX_ERRORS:
                    break
                if k not in fields:
                    errors.append(error("extra_forbidden", (*loc, k), "Extra inputs are not permitted", x))
        return errors
    return check


def validate(check: Check, body: Any) -> None:
    """Raise ValidationFailed with the first MAX_ERRORS errors of `body`."""
    errors = check(body, ())
    if errors:
        raise ValidationFailed(errors[:MAX_ERRORS])
