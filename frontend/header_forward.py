"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern`: request headers (gRPC
metadata) whose names match the pattern reach the model as string request parameters.

Triton's rule (server src/http_server.cc ForEachHeader, src/grpc/infer_handler.h
ForwardHeadersAsParameters): the pattern is an RE2 expression searched anywhere in the name
(PartialMatch), case-insensitively unless the pattern turns that off with `(?-i)`; a matching
name that is a reserved parameter key or starts with `triton_` fails the request; a forwarded
header is added after the body's parameters, so it wins over a body parameter of its name.
A frontend builds one `HeaderForward` at startup only when a pattern was given: without one the
infer path does nothing extra.
"""
from __future__ import annotations

import re
from typing import Iterable

from tritond.wire.errors import TritonError, invalid

# Triton's kReservedParameterKeys (server src/common.h)
RESERVED_KEYS = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                           "binary_data_output"))
RESERVED_PREFIX = "triton_"

_FLAG_GROUP = re.compile(r"\(\?([a-zA-Z]*(?:-[a-zA-Z]*)?)\)")
_RE2_FLAGS = set("ims")


class PatternError(ValueError):
    """A forward pattern that cannot be compiled (the message says why)."""


def _scoped(pattern: str) -> str:
    """RE2's `(?flags)` sets flags up to the end of the enclosing group; Python accepts flags
    there only at the very start, so each becomes a scoped `(?flags:...)` group closed where
    its enclosing group (or an alternative of it) ends."""
    out: list[str] = []
    opened = [[]]          # per group nesting level: the flag groups opened at that level
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            if pattern[i:i + 1] == "^":
                out.append("^")
                i += 1
            if pattern[i:i + 1] == "]":     # a leading ']' is literal
                out.append("]")
                i += 1
            continue
        elif c == "(":
            m = _FLAG_GROUP.match(pattern, i)
            if m is not None and m.group(1).strip("-"):
                flags = m.group(1)
                unknown = set(flags) - _RE2_FLAGS - {"-"}
                if unknown:
                    raise PatternError(f"flag(s) '{''.join(sorted(unknown))}' are not supported in {pattern!r}")
                out.append(f"(?{flags}:")
                opened[-1].append(flags)
                i = m.end()
                continue
            opened.append([])
        elif c == "|":
            out.append(")" * len(opened[-1]) + "|" + "".join(f"(?{f}:" for f in opened[-1]))
            i += 1
            continue
        elif c == ")" and len(opened) > 1:
            out.append(")" * len(opened.pop()))
        out.append(c)
        i += 1
    out.append(")" * len(opened[0]))
    return "".join(out)


def compile_pattern(pattern: str) -> re.Pattern:
    """The pattern as Triton matches it (RE2 syntax, `(?i)` in front); PatternError if invalid."""
    try:
        return re.compile(_scoped(pattern), re.IGNORECASE)
    except re.error as e:
        raise PatternError(f"invalid regular expression {pattern!r}: {e}") from None


class HeaderForward:
    """The forwarding of one frontend's requests."""

    def __init__(self, pattern: str) -> None:
        self.search = compile_pattern(pattern).search

    def parameters(self, headers: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
        """The forwarded headers as parameters; a reserved name fails the request as in Triton."""
        found: dict[str, str] = {}
        for key, value in headers:
            if self.search(key) is None:
                continue
            if key in RESERVED_KEYS or key.startswith(RESERVED_PREFIX):
                raise reserved(key)
            found[key] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return found


def reserved(key: str) -> TritonError:
    return invalid(f"Header '{key}' is reserved for Triton usage and cannot be forwarded.")
