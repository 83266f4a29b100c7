"""The shortest end-to-end path: start, infer over HTTP, stop clean."""
import numpy as np
import tritonclient.http as httpclient


def test_identity_round_trip(server):
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_ready()
    x = np.arange(16, dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [16], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("identity_fp32", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
