"""Log messages as Triton writes them: a JSON string per message unless the server starts with
TRITON_SERVER_ESCAPE_LOG_MESSAGES=0, so a client's input name cannot forge a log line."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import TritondServer, build_example_repository, expect_error, serving

DEFAULT = re.compile(r"^[IWE]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [\w.]+:\d+\] (?P<message>.*)$")
ISO8601 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z [IWE] \d+ [\w.]+:\d+\] (?P<message>.*)$")
TABLE_LINE = re.compile(r"^(\+[-+]+\+|\| .* \|)$")
FORGED = "I0205 18:34:18.707423 1 file.cc:123] THIS ENTRY WAS INJECTED"


def send_forged_input(s: TritondServer) -> None:
    """One request per protocol whose input name carries two forged log lines."""
    name = f"\n{FORGED}\n{FORGED}"
    x = np.ones(3, dtype=np.float32)
    h = httpclient.InferInput(name, list(x.shape), "FP32")
    h.set_data_from_numpy(x)
    expect_error(lambda: httpclient.InferenceServerClient(s.http_url).infer("identity_fp32", [h]), 400,
                 "unexpected inference input")
    g = grpcclient.InferInput(name, list(x.shape), "FP32")
    g.set_data_from_numpy(x)
    expect_error(lambda: grpcclient.InferenceServerClient(s.grpc_url).infer("identity_fp32", [g]), 400,
                 "unexpected inference input", protocol="grpc")


@pytest.mark.parametrize("escaped,fmt,pattern", [(True, "default", DEFAULT), (False, "ISO8601", ISO8601)],
                         ids=["escaped-default", "raw-ISO8601"])
def test_messages_escaped_unless_switched_off(tmp_path, escaped, fmt, pattern):
    repo = build_example_repository(tmp_path / "repo", ("identity_fp32",))
    log = tmp_path / "server.log"
    env = {} if escaped else {"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "0"}
    with serving(TritondServer(repo, [f"--log-file={log}", f"--log-format={fmt}", "--log-verbose=1"],
                               env=env)) as s:
        send_forged_input(s)
    lines = log.read_text().splitlines()
    forged = [line for line in lines if line == FORGED]
    failures = [line for line in lines if "failed: " in line and "unexpected inference input" in line]
    assert len(failures) >= 2, lines      # the verbose line of each protocol's refusal
    if escaped:
        assert not forged, forged
        for line in lines:
            if TABLE_LINE.match(line):      # the start-up table of models, after an empty heading
                continue
            m = pattern.match(line)
            assert m, f"a line of no record of its own: {line!r}"
            assert m["message"] == "" or isinstance(json.loads(m["message"]), str), line
        assert all(FORGED in json.loads(pattern.match(line)["message"]) for line in failures)
    else:
        assert len(forged) >= 2, lines        # a line of its own per refused request, as the client wrote it
        assert not any(pattern.match(line)["message"].startswith('"') for line in lines if pattern.match(line))
