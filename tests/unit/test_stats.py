"""ModelStats counts what Triton counts, in Triton's JSON shape."""
import msgspec

from tritond.broker.observe.stats import ModelStats
from tritond.wire.replies import StatisticDuration as D


def test_zero_before_any_inference():
    d = msgspec.to_builtins(ModelStats("m", 3).statistics())
    assert list(d) == ["name", "version", "last_inference", "inference_count", "execution_count",
                       "inference_stats", "response_stats", "batch_stats", "memory_usage"]
    assert (d["name"], d["version"], d["last_inference"]) == ("m", "3", 0)
    assert (d["inference_count"], d["execution_count"], d["batch_stats"]) == (0, 0, [])
    assert (d["response_stats"], d["memory_usage"]) == ({}, [])
    assert set(d["inference_stats"]) == {"success", "fail", "queue", "compute_input", "compute_infer",
                                         "compute_output", "cache_hit", "cache_miss"}
    assert all(v == {"count": 0, "ns": 0} for v in d["inference_stats"].values())


def test_one_batch_of_two_requests_one_failed():
    s = ModelStats("m", 1)
    s.record_execution(5, 10, 20, 30)           # requests of batch size 2 and 3
    s.record_success(2, 1000, 100, 10, 20, 30)
    s.record_failure(900)
    d = s.statistics()
    assert d.inference_count == 2               # only the successful request's elements
    assert d.execution_count == 1
    st = d.inference_stats
    assert st.success == D(1, 1000)
    assert st.fail == D(1, 900)
    assert st.queue == D(1, 100)
    assert (st.compute_input, st.compute_infer, st.compute_output) == (D(1, 10), D(1, 20), D(1, 30))
    assert msgspec.to_builtins(d.batch_stats) == [{"batch_size": 5, "compute_input": {"count": 1, "ns": 10},
                                                   "compute_infer": {"count": 1, "ns": 20},
                                                   "compute_output": {"count": 1, "ns": 30}}]
    assert d.last_inference > 0


def test_batch_stats_per_size_sorted():
    s = ModelStats("m", 1)
    for size in (4, 1, 4):
        s.record_execution(size, 1, 1, 1)
    assert [(b.batch_size, b.compute_infer.count) for b in s.statistics().batch_stats] == [(1, 1), (4, 2)]
