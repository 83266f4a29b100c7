"""Triton's generate extension: POST /v2/models/{m}[/versions/{v}]/generate and /generate_stream.

The body is a flat JSON object: a key naming a model input becomes that input (a scalar or a
1-D array, shaped after the model's metadata: fixed dimensions divide the element count, the
innermost variable one takes the rest, other variable ones are 1); any other key, and the keys
of a nested "parameters" object treated the same way, become request parameters. A response is
a flat object: id, model_name, model_version, response parameters and outputs by name (a
single element as a scalar), keys sorted, as Triton writes them. /generate answers exactly one
response; /generate_stream sends each response as a Server-Sent Event `data: {...}`, errors
in-stream as `data: {"error": "..."}`.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tritond.repository.datatypes import ELEMENT_SIZE, WIRE_TO_NUMPY, serialize_bytes
from tritond.wire import schema as S
from tritond.wire.errors import Code, TritonError, invalid

from ..dataplane import Dataplane, InferResult, InputTensor, RequestOptions, Streamed
from ..errors import http_status
from .disconnect import until_disconnect

ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                "generates various number of responses")
SSE_MEDIA_TYPE = "text/event-stream; charset=utf-8"


def _shape(name: str, dims: list[int], count: int) -> list[int]:
    """Triton's two passes: fixed dimensions divide the element count, the innermost variable
    dimension takes what is left, other variable ones are 1."""
    shape = list(dims)
    for d in reversed(shape):
        if d != -1:
            if d == 0 or count % d:
                raise invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
            count //= d
    for i in range(len(shape) - 1, -1, -1):
        if shape[i] == -1:
            shape[i], count = count, 1
    if count != 1:
        raise invalid(f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape


# Triton reads generate values with TritonJson; a value of the wrong JSON type fails with its words.
_JSON_KIND = {"BOOL": "boolean", "FP32": "double", "FP64": "double",
              **{t: "unsigned-integer" for t in ("UINT8", "UINT16", "UINT32", "UINT64")},
              **{t: "signed-integer" for t in ("INT8", "INT16", "INT32", "INT64")}}


def _json_kind_ok(kind: str, x: Any) -> bool:
    if kind == "boolean":
        return isinstance(x, bool)
    if isinstance(x, bool):
        return False
    if kind == "double":
        return isinstance(x, (int, float))
    if not isinstance(x, int):
        return False
    return 0 <= x < 1 << 64 if kind == "unsigned-integer" else -(1 << 63) <= x < 1 << 63


def _tensor(name: str, view: S.TensorView, batching: bool, value: Any) -> tuple[InputTensor, int]:
    items = value if isinstance(value, list) else [value]
    datatype = view.datatype
    if datatype == "BYTES" and not all(isinstance(x, str) for x in items):
        raise invalid("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
    shape = _shape(name, ([-1] if batching else []) + list(view.dims), len(items))
    if datatype == "BYTES":
        data = serialize_bytes(np.array([x.encode() for x in items], dtype=object))
        return InputTensor(name, datatype, shape, data), len(data)
    kind = _JSON_KIND.get(datatype)
    if kind is None or not ELEMENT_SIZE.get(datatype):
        raise invalid(f"input '{name}' has unsupported datatype {datatype}")
    if not all(_json_kind_ok(kind, x) for x in items):
        raise invalid(f"Unable to parse 'data': attempt to access JSON non-{kind} as {kind}")
    try:
        data = np.array(items, dtype=WIRE_TO_NUMPY[datatype]).tobytes()
    except (ValueError, TypeError, OverflowError):
        raise invalid(f"Unable to parse 'data' of input '{name}': expected {datatype} values") from None
    return InputTensor(name, datatype, shape, data), len(data)


def _parameter(name: str, value: Any) -> S.Param:
    if isinstance(value, (str, bool, int, float)):
        return value
    raise invalid(f"parameter '{name}' has invalid type. It should be either 'int', 'bool', or 'string'.")


class _Object(dict):
    """A JSON object that also keeps its members in order, repeated keys included (Triton adds
    each input as it reads it, so a repeated one is an error, not the last value)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def parse_generate(body: bytes, entry: S.ModelEntry, max_input_size: int) -> tuple[list[InputTensor], RequestOptions]:
    """The inputs and options of a generate request (raises INVALID_ARG with Triton's texts)."""
    view = entry.view or S.ModelView()
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise invalid(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(doc, dict):
        raise invalid("failed to parse the request JSON buffer: the request must be a JSON object")
    if any(body.count(b'"%s"' % name.encode()) > 1 for name in view.inputs):
        doc = json.loads(body, object_pairs_hook=_Object)     # keeps every key, duplicates too
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("Unable to parse 'id'")
    batching = view.max_batch_size > 0
    inputs: list[InputTensor] = []
    params: dict[str, S.Param] = {}
    consumed = [0]

    seen: set[str] = set()

    def convert(obj: dict[str, Any], nested: bool) -> None:
        for key, value in (obj.pairs if isinstance(obj, _Object) else obj.items()):
            if key == "parameters" and not nested:
                if key in view.inputs:
                    raise invalid("Keyword 'parameters' for nested schema also given as input tensor name")
                if not isinstance(value, dict):
                    raise invalid("Expected JSON object for keyword: 'parameters'")
                try:
                    convert(value, True)
                except TritonError as e:
                    raise TritonError(e.code, f"Converting keyword: 'parameters': {e.message}") from None
            elif key in view.inputs:
                if key in seen:
                    raise invalid(f"input '{key}' already exists in request")
                seen.add(key)
                tensor, size = _tensor(key, view.inputs[key], batching, value)
                if size + consumed[0] > max_input_size:
                    raise invalid(f"request size of {consumed[0]} bytes with input '{key}' of size {size} bytes "
                                  f"exceeds the maximum allowed input size of {max_input_size}. Use "
                                  f"--http-max-input-size to increase the limit.")
                consumed[0] += size
                inputs.append(tensor)
            else:
                params[key] = _parameter(key, value)

    convert(doc, False)
    return inputs, RequestOptions(id=request_id, params=params)


def render_generate(result: InferResult) -> dict[str, Any]:
    doc: dict[str, Any] = {"model_name": result.model_name, "model_version": str(result.model_version)}
    if result.id:
        doc["id"] = result.id
    doc.update(result.parameters)
    for t in result.outputs:
        if t.data is None:
            raise TritonError(Code.INTERNAL, f"non-JSON output response type is requested for '{t.name}'")
        arr = t.as_numpy().reshape(-1)
        values = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in arr.tolist()]
        doc[t.name] = values[0] if len(values) == 1 else values
    return dict(sorted(doc.items()))


def error_body(e: TritonError) -> bytes:
    return orjson.dumps({"error": e.message})


def event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


async def events(first: Streamed, rest: AsyncIterator[Streamed]) -> AsyncIterator[bytes]:
    """The Server-Sent Events of a streamed generate request, starting with its first reply
    (already taken, to choose the status code)."""
    item: Streamed | None = first
    while item is not None:
        if item.error is not None:
            yield event(error_body(item.error))
        elif item.result is not None:
            yield event(orjson.dumps(render_generate(item.result)))
        if item.final:
            return
        try:
            item = await rest.__anext__()
        except TritonError as e:        # the broker went away: the stream ends with the error
            item = Streamed(None, e, True)


async def generate(dp: Dataplane, request: Request, entry: S.ModelEntry, inputs: list[InputTensor],
                   opts: RequestOptions) -> Response:
    """/generate: one response as JSON (a decoupled model must send exactly one), with that
    response's status. Any other number of responses is Triton's INTERNAL error, a 500: Triton
    writes that error after the first response's 200 has gone out, but its replies are
    buffered here until the last, so an error is never sent as a 200."""
    if entry.view is None or not entry.view.decoupled:
        result = await until_disconnect(request.receive, dp.infer(entry, inputs, [], opts))
        try:
            return Response(orjson.dumps(render_generate(result)), media_type="application/json")
        finally:
            dp.release(result)
    answers: list[tuple[int, bytes]] = []
    async for item in dp.infer_stream(entry, inputs, [], opts):
        if item.error is not None:
            answers.append((http_status(item.error), error_body(item.error)))
        elif item.result is not None:
            answers.append((200, orjson.dumps(render_generate(item.result))))
    if len(answers) != 1:
        error = TritonError(Code.INTERNAL, ONE_RESPONSE)
        answers = [(http_status(error), error_body(error))]
    status, body = answers[0]
    return Response(body, status_code=status, media_type="application/json")


async def generate_stream(dp: Dataplane, request: Request, entry: S.ModelEntry, inputs: list[InputTensor],
                          opts: RequestOptions) -> Response:
    """/generate_stream: each response as a Server-Sent Event; the status is the first one's.
    A client that goes away cancels the request (Starlette stops the event iterator)."""
    if entry.view is None or not entry.view.decoupled:
        result = await until_disconnect(request.receive, dp.infer(entry, inputs, [], opts))
        try:
            return Response(event(orjson.dumps(render_generate(result))), media_type=SSE_MEDIA_TYPE)
        finally:
            dp.release(result)
    replies = dp.infer_stream(entry, inputs, [], opts)
    first = await replies.__anext__()
    status = http_status(first.error) if first.error is not None else 200
    return StreamingResponse(events(first, replies), status_code=status, media_type=SSE_MEDIA_TYPE)
