"""ModelStats counts what Triton counts, in Triton's JSON shape."""
from tritond.broker.observe.stats import ModelStats


def test_zero_before_any_inference():
    d = ModelStats("m", 3).as_dict()
    assert (d["name"], d["version"], d["last_inference"]) == ("m", "3", 0)
    assert (d["inference_count"], d["execution_count"], d["batch_stats"]) == (0, 0, [])
    assert set(d["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                         "compute_output", "cache_hit", "cache_miss"}
    assert all(v == {"count": 0, "ns": 0} for v in d["inference_stats"].values())


def test_one_batch_of_two_requests_one_failed():
    s = ModelStats("m", 1)
    s.record_execution(5, 10, 20, 30)           # requests of batch size 2 and 3
    s.record_success(2, 1000, 100, 10, 20, 30)
    s.record_failure(900)
    d = s.as_dict()
    assert d["inference_count"] == 2            # only the successful request's elements
    assert d["execution_count"] == 1
    st = d["inference_stats"]
    assert st["success"] == {"count": 1, "ns": 1000}
    assert st["fail"] == {"count": 1, "ns": 900}
    assert st["queue"] == {"count": 1, "ns": 100}
    assert (st["compute_input"], st["compute_infer"], st["compute_output"]) == (
        {"count": 1, "ns": 10}, {"count": 1, "ns": 20}, {"count": 1, "ns": 30})
    assert d["batch_stats"] == [{"batch_size": 5, "compute_input": {"count": 1, "ns": 10},
                                 "compute_infer": {"count": 1, "ns": 20},
                                 "compute_output": {"count": 1, "ns": 30}}]
    assert d["last_inference"] > 0


def test_batch_stats_per_size_sorted():
    s = ModelStats("m", 1)
    for size in (4, 1, 4):
        s.record_execution(size, 1, 1, 1)
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in s.as_dict()["batch_stats"]] == [(1, 1), (4, 2)]
