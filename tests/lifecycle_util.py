"""Helpers the model lifecycle tests share (explicit and poll mode, warmup, rate limiter)."""
from __future__ import annotations

import numpy as np
import tritonclient.http as httpclient

from conftest import TritondServer, http_get


def infer(client: httpclient.InferenceServerClient, model: str, rows: int = 1, version: str = "",
          **params) -> httpclient.InferResult:
    inp = httpclient.InferInput("INPUT0", [rows, 2], "FP32")
    inp.set_data_from_numpy(np.ones((rows, 2), dtype=np.float32))
    return client.infer(model, [inp], model_version=version, parameters=params or None)


def tag(client: httpclient.InferenceServerClient, model: str) -> int:
    """The TAG output of a fault model: which config served the request."""
    return int(infer(client, model).as_numpy("TAG")[0][0])


def index(client: httpclient.InferenceServerClient) -> dict[tuple[str, str], dict]:
    return {(m["name"], m.get("version", "")): m for m in client.get_model_repository_index()}


def model_ready(server: TritondServer, model: str, version: str = "") -> bool:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
    return http_get(f"http://{server.http_url}{path}", 2.0)[0] == 200
