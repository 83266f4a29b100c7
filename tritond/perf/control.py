"""The server calls a load generator and an analyzer need besides inference: metadata, config,
statistics, explicit load, system shared-memory registration, over HTTP or gRPC.

These are few and off the hot path, so they are plain blocking calls (the measuring loop runs
them in a thread). HTTP uses http.client, since the base install has no tritonclient HTTP
extra; gRPC uses tritonclient's own client. Both return JSON-shaped dicts with 64-bit
integers as numbers, as the HTTP API renders them.
"""
from __future__ import annotations

import http.client
import json
from typing import Any, Protocol
from urllib.parse import quote

from tritond.repository.render import config_to_json

from .loadgen import split_target

CONTROL_TIMEOUT_S = 120.0


class ControlError(RuntimeError):
    """The server refused a control call or could not be reached; the message says which."""


class Control(Protocol):
    def server_extensions(self) -> set[str]: ...
    def model_metadata(self, model: str, version: str = "") -> dict: ...
    def model_config(self, model: str, version: str = "") -> dict: ...
    def model_stats(self, model: str, version: str = "") -> list[dict]: ...
    def is_model_ready(self, model: str, version: str = "") -> bool: ...
    def load_model(self, model: str, config: dict | None = None) -> None: ...
    def register_system_shm(self, name: str, key: str, byte_size: int) -> None: ...
    def unregister_system_shm(self, name: str) -> None: ...
    def close(self) -> None: ...


def _version_path(model: str, version: str) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}" if version else path


class HttpControl:
    """Control calls over the HTTP API, one short-lived connection per call."""

    def __init__(self, url: str, timeout: float = CONTROL_TIMEOUT_S) -> None:
        self.host, self.port = split_target(url)
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except OSError as e:
            raise ControlError(f"cannot reach {self.host}:{self.port}: {e}") from None
        finally:
            conn.close()
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"error": raw[:300].decode(errors="replace")}
        return resp.status, payload

    def _ok(self, method: str, path: str, body: Any = None) -> Any:
        status, payload = self._call(method, path, body)
        if status != 200:
            message = payload.get("error") if isinstance(payload, dict) else None
            raise ControlError(message or f"HTTP {status} from {method} {path}")
        return payload

    def server_extensions(self) -> set[str]:
        return set(self._ok("GET", "/v2").get("extensions", []))

    def model_metadata(self, model: str, version: str = "") -> dict:
        return self._ok("GET", _version_path(model, version))

    def model_config(self, model: str, version: str = "") -> dict:
        return self._ok("GET", _version_path(model, version) + "/config")

    def model_stats(self, model: str, version: str = "") -> list[dict]:
        return self._ok("GET", _version_path(model, version) + "/stats").get("model_stats", [])

    def is_model_ready(self, model: str, version: str = "") -> bool:
        status, _ = self._call("GET", _version_path(model, version) + "/ready")
        return status == 200

    def load_model(self, model: str, config: dict | None = None) -> None:
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        self._ok("POST", f"/v2/repository/models/{quote(model, safe='')}/load", body)

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        self._ok("POST", f"/v2/systemsharedmemory/region/{quote(name, safe='')}/register",
                 {"key": key, "offset": 0, "byte_size": byte_size})

    def unregister_system_shm(self, name: str) -> None:
        self._ok("POST", f"/v2/systemsharedmemory/region/{quote(name, safe='')}/unregister")

    def close(self) -> None:
        pass


_INT64_KEYS = frozenset({"count", "ns", "inference_count", "execution_count", "last_inference",
                         "batch_size", "restart_count", "byte_size", "shape"})


def _numbers(value: Any, key: str = "") -> Any:
    """gRPC's JSON renders 64-bit integers as strings; turn those of the known int64 fields
    (statistics counters, tensor shapes) back into ints, leaving names and versions alone."""
    if isinstance(value, dict):
        return {k: _numbers(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v, key) for v in value]
    if key in _INT64_KEYS and isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


class GrpcControl:
    """Control calls over the gRPC API through tritonclient.grpc."""

    def __init__(self, url: str, timeout: float = CONTROL_TIMEOUT_S) -> None:
        import tritonclient.grpc as grpcclient

        self._client = grpcclient.InferenceServerClient(url)
        self._error = grpcclient.InferenceServerException
        self.timeout = timeout

    def _ok(self, call, *args, **kwargs) -> Any:
        try:
            return call(*args, client_timeout=self.timeout, **kwargs)
        except self._error as e:
            raise ControlError(e.message() or str(e)) from None

    def server_extensions(self) -> set[str]:
        return set(self._ok(self._client.get_server_metadata, as_json=True).get("extensions", []))

    def model_metadata(self, model: str, version: str = "") -> dict:
        return _numbers(self._ok(self._client.get_model_metadata, model, version, as_json=True))

    def model_config(self, model: str, version: str = "") -> dict:
        return config_to_json(self._ok(self._client.get_model_config, model, version).config)

    def model_stats(self, model: str, version: str = "") -> list[dict]:
        stats = self._ok(self._client.get_inference_statistics, model, version, as_json=True)
        return _numbers(stats).get("model_stats", [])

    def is_model_ready(self, model: str, version: str = "") -> bool:
        try:
            return bool(self._ok(self._client.is_model_ready, model, version))
        except ControlError:
            return False

    def load_model(self, model: str, config: dict | None = None) -> None:
        self._ok(self._client.load_model, model, config=None if config is None else json.dumps(config))

    def register_system_shm(self, name: str, key: str, byte_size: int) -> None:
        self._ok(self._client.register_system_shared_memory, name, key, byte_size)

    def unregister_system_shm(self, name: str) -> None:
        self._ok(self._client.unregister_system_shared_memory, name)

    def close(self) -> None:
        self._client.close()


def connect(url: str, protocol: str) -> Control:
    """The control client for `protocol` ('http' or 'grpc') at `url` (host:port)."""
    if protocol == "http":
        return HttpControl(url)
    if protocol == "grpc":
        return GrpcControl(url)
    raise ValueError(f"unknown protocol {protocol!r}")
