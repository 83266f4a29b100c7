"""Mistakes caught before or instead of serving: a port another process listens on, a
misspelt restricted-API category, a missing repository with --exit-on-error=false, and a
classification request on a BYTES output."""
import socket

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, http_get, serving


def test_a_port_in_use_is_refused_at_startup(example_repo):
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)   # as another tritond would
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        s = TritondServer(example_repo)
        s.http_port = holder.getsockname()[1]
        s.start(wait="exit")
        assert s.returncode == 1
        assert f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{s.http_port}' already in use" \
            in s.log
        s.assert_clean()
    finally:
        holder.close()


def test_misspelt_restricted_category_is_a_usage_error(example_repo):
    s = TritondServer(example_repo, ["--http-restricted-api=model_repository:admin-key=secret"])
    s.start(wait="exit")
    assert s.returncode == 1
    assert "unknown restricted api 'model_repository'" in s.log
    s.assert_clean()


def test_a_missing_repository_with_exit_on_error_false_is_up_but_neither_live_nor_ready(tmp_path):
    """As tritonserver: the server answers metadata, health says not live and not ready."""
    with serving(TritondServer(tmp_path / "missing", ["--exit-on-error=false"]), wait="metadata") as s:
        assert http_get(f"http://{s.http_url}/v2/health/live")[0] == 400
        assert http_get(f"http://{s.http_url}/v2/health/ready")[0] == 400
        g = grpcclient.InferenceServerClient(s.grpc_url)
        assert (g.is_server_live(), g.is_server_ready()) == (False, False)
        assert g.get_server_metadata().name == "triton"
        assert "failed to initialize: model repository" in s.log


def test_classification_of_a_bytes_output_is_refused(server):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", [2], "BYTES")
    inp.set_data_from_numpy(np.array([b"a", b"bc"], dtype=object))
    with pytest.raises(InferenceServerException) as e:
        client.infer("string_upper", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=1)])
    assert "class result not available for output due to unsupported type 'BYTES'" in str(e.value)
    assert client.is_server_live()
