"""A Python model's own metrics (pb_utils.MetricFamily), as Triton serves them beside its own
(L0_backend_python/custom_metrics): counters, gauges and histograms on the metrics endpoint,
one value shared by every instance that names the same family and labels, the operations a kind
refuses refused, and the series gone with the last worker that held them."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from conftest import TritondServer, http_get, serving, wait_for

CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "X" data_type: TYPE_FP32 dims: [1] }]
output [{ name: "ERRORS" data_type: TYPE_STRING dims: [-1] }]
instance_group [{ count: 2 kind: KIND_CPU }]
"""

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    \"\"\"Counts its requests, sets a gauge to X and observes X; answers with what was refused.\"\"\"

    def initialize(self, args):
        requests = pb_utils.MetricFamily("app_requests", "requests seen", pb_utils.MetricFamily.COUNTER)
        self.count = requests.Metric(labels={"model": args["model_name"]})
        self.count_again = requests.Metric(labels={"model": args["model_name"]})   # the same series
        last = pb_utils.MetricFamily("app_last_x", "last X", pb_utils.MetricFamily.GAUGE)
        sizes = pb_utils.MetricFamily("app_x", "X seen", pb_utils.MetricFamily.HISTOGRAM)
        self.last, self.sizes = last.Metric(), sizes.Metric(buckets=[1.0, 10.0])
        self.families = [requests, last, sizes]       # a metric whose family object is deleted refuses to work

    def execute(self, requests):
        out = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            self.count.increment(1)
            self.last.set(x)
            self.sizes.observe(x)
            refused = []
            for name, call in (("counter set", lambda: self.count.set(3)),
                               ("counter decrement", lambda: self.count.increment(-1)),
                               ("gauge observe", lambda: self.last.observe(1)),
                               ("histogram value", lambda: self.sizes.value()),
                               ("other kind", lambda: pb_utils.MetricFamily("app_x", "", pb_utils.MetricFamily.GAUGE)),
                               ("no buckets", lambda: pb_utils.MetricFamily(
                                   "app_h", "", pb_utils.MetricFamily.HISTOGRAM).Metric()),
                               ("unordered buckets", lambda: pb_utils.MetricFamily(
                                   "app_h", "", pb_utils.MetricFamily.HISTOGRAM).Metric(buckets=[2, 1]))):
                try:
                    call()
                except pb_utils.TritonModelException:
                    refused.append(name)
            if self.count_again.value() != self.count.value():
                refused.append("the same series differs")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("ERRORS", np.array(refused, dtype=object))]))
        return out
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("custom_metrics")
    (root / "counted" / "1").mkdir(parents=True)
    (root / "counted" / "config.pbtxt").write_text(CONFIG)
    (root / "counted" / "1" / "model.py").write_text(MODEL)
    with serving(TritondServer(root, ["--model-control-mode=explicit", "--load-model=counted"])) as s:
        yield s


def samples(server) -> dict[tuple, float]:
    _, body = http_get(f"http://127.0.0.1:{server.metrics_port}/metrics")
    return {(sm.name, tuple(sorted(sm.labels.items()))): sm.value
            for f in text_string_to_metric_families(body.decode()) for sm in f.samples if sm.name.startswith("app_")}


def test_a_models_metrics_are_served_and_shared_by_its_instances(server):
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    for x in (0.5, 5.0, 50.0, 7.0):
        inp = httpclient.InferInput("X", [1], "FP32")
        inp.set_data_from_numpy(np.array([x], np.float32))
        refused = client.infer("counted", [inp]).as_numpy("ERRORS").tolist()
        assert refused == [b"counter set", b"counter decrement", b"gauge observe", b"histogram value",
                           b"other kind", b"no buckets", b"unordered buckets"]
    got = samples(server)
    assert got[("app_requests_total", (("model", "counted"),))] == 4, "both instances count into one series"
    assert got[("app_last_x", ())] == 7.0
    assert got[("app_x_bucket", (("le", "1"),))] == 1 and got[("app_x_bucket", (("le", "10"),))] == 3
    assert got[("app_x_count", ())] == 4 and got[("app_x_sum", ())] == pytest.approx(62.5)


def test_the_series_go_with_the_workers_that_held_them(server):
    client = httpclient.InferenceServerClient(server.http_url)
    client.unload_model("counted")
    wait_for(lambda: not samples(server), what="the model's series to leave the metrics endpoint")


def test_every_brokers_families_are_served(tmp_path):
    """With --broker-shards each broker holds its own models' families; a scrape shows them all."""
    from tritond.repository.partition import partition

    names = [f"counted_{i}" for i in range(8)]
    shard = partition({n: [] for n in names}, 2)
    picked = [next(n for n in names if shard[n] == k) for k in (0, 1)]
    for name in picked:
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG.replace("count: 2", "count: 1"))
        (tmp_path / name / "1" / "model.py").write_text(MODEL)
    with serving(TritondServer(tmp_path, ["--broker-shards", "2"])) as s:
        client = httpclient.InferenceServerClient(s.http_url)
        for name in picked:
            inp = httpclient.InferInput("X", [1], "FP32")
            inp.set_data_from_numpy(np.array([1.0], np.float32))
            client.infer(name, [inp])
        got = samples(s)
    assert all(got[("app_requests_total", (("model", name),))] == 1 for name in picked), got
