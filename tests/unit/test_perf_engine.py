"""The pure parts of `tritond perf`: perf_analyzer's measurement arithmetic (percentile rank,
stability test, window merging), its CSV columns and rounding, ranges and request data."""
import base64
import json

import numpy as np
import pytest

from tritond.perf.cli import UsageError, parse_range
from tritond.perf.engine import LevelResult, ServerStats, Window, is_stable, percentile_index, summarize
from tritond.perf.inputs import InputDataError, parse_shapes, request_data
from tritond.perf.results import csv_header, csv_row, summary_lines, write_csv

MLP_META = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 256]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 256]}]}


def test_percentile_rank_is_perf_analyzers():
    # index = p/100 * (n - 1) + 0.5, truncated
    assert percentile_index(50, 100) == 50
    assert percentile_index(99, 100) == 98
    assert percentile_index(99, 1) == 0
    assert percentile_index(95, 21) == 19


def test_stability_needs_three_windows_within_the_threshold():
    assert not is_stable([(100, 1.0), (100, 1.0)], 0.1)
    assert is_stable([(50, 9.0), (100, 1.0), (105, 1.05), (109, 1.09)], 0.1)
    assert not is_stable([(100, 1.0), (105, 1.05), (111, 1.0)], 0.1)       # throughput spread 11%
    assert not is_stable([(100, 1.0), (100, 1.2), (100, 1.0)], 0.1)        # latency spread 20%
    assert not is_stable([(100, 1.0), (0, 0.0), (100, 1.0)], 0.5)          # an empty window


def _stats(**kw) -> ServerStats:
    return ServerStats(**kw)


def test_server_stats_deltas_and_averages():
    entry = {"inference_count": 12, "execution_count": 4, "inference_stats": {
        "success": {"count": 10, "ns": 10_000_000}, "queue": {"count": 10, "ns": 2_000_000},
        "compute_input": {"count": 10, "ns": 100_000}, "compute_infer": {"count": 10, "ns": 5_000_000},
        "compute_output": {"count": 10, "ns": 200_000}},
        "batch_stats": [{"batch_size": 2, "compute_infer": {"count": 2, "ns": 1_000_000}},
                        {"batch_size": 4, "compute_infer": {"count": 2, "ns": 1_600_000}}]}
    after = ServerStats.from_json(entry)
    before = _stats(success_count=4, success_ns=4_000_000, queue_count=4, queue_ns=1_000_000,
                    inference_count=4, execution_count=2, batches={2: 2}, execution_infer_ns=1_000_000)
    d = after - before
    assert (d.success_count, d.queue_count, d.inference_count, d.execution_count) == (6, 6, 8, 2)
    assert d.batches == {4: 2}
    assert d.avg_queue_ns == 1_000_000 // 6
    assert d.avg_batch_size == 4.0
    assert d.infer_ns_per_inference == 1_600_000 / 8
    assert (d + before).batches == after.batches


def _window(latencies_us, duration_s=1.0, send=10, recv=20, server=None):
    return Window([(0, us * 1000, send * 1000, recv * 1000) for us in latencies_us], int(duration_s * 1e9),
                  server, 0, 0)


def test_merged_windows_pool_latencies_and_time():
    windows = [_window(range(1, 101)), _window(range(101, 201)), _window(range(201, 301))]
    r = summarize(windows, "concurrency", 4, batch_size=2, percentile=-1, stable=True, windows_run=5)
    assert r.request_count == 300
    assert r.infer_per_sec == pytest.approx(300 * 2 / 3.0)
    assert r.percentiles_ns[50] == 151_000 and r.percentiles_ns[99] == 297_000
    assert r.avg_latency_ns == 150_500
    assert r.latency_ns(-1) == r.avg_latency_ns
    assert set(r.percentiles_ns) == {50, 90, 95, 99}
    extra = summarize(windows, "concurrency", 4, 1, percentile=85, stable=True, windows_run=3)
    assert sorted(extra.percentiles_ns) == [50, 85, 90, 95, 99]
    assert extra.latency_ns(85) == extra.percentiles_ns[85]


def _result(mode="concurrency", level=1, ips=1234.5678, server=True) -> LevelResult:
    stats = ServerStats(success_count=100, success_ns=100 * 900_000, queue_count=100, queue_ns=100 * 300_000,
                        compute_input_count=100, compute_input_ns=100 * 20_000, compute_infer_count=100,
                        compute_infer_ns=100 * 400_000, compute_output_count=100, compute_output_ns=100 * 30_000)
    return LevelResult(mode=mode, level=level, batch_size=1, request_count=100, duration_ns=10**9, infer_per_sec=ips,
                       avg_latency_ns=1_500_000, std_us=3, percentiles_ns={50: 1_400_999, 90: 1_800_000,
                                                                           95: 1_900_000, 99: 2_500_000},
                       avg_send_ns=25_500, avg_recv_ns=40_000, server=stats if server else None, stable=True,
                       windows=3)


def test_csv_columns_and_arithmetic_match_perf_analyzer():
    r = _result()
    assert csv_header([r]) == ["Concurrency", "Inferences/Second", "Client Send", "Network+Server Send/Recv",
                               "Server Queue", "Server Compute Input", "Server Compute Infer",
                               "Server Compute Output", "Client Recv", "p50 latency", "p90 latency",
                               "p95 latency", "p99 latency"]
    # network = avg latency - send - recv - queue - compute, all in whole microseconds
    assert csv_row(r) == ["1", "1234.57", "25", "684", "300", "20", "400", "30", "40", "1400", "1800", "1900", "2500"]
    assert csv_header([r], verbose=True)[-3:] == ["Avg latency", "request/response", "response wait"]
    assert csv_row(r, verbose=True)[-3:] == ["1500", "65", "1434"]
    rate = _result(mode="request_rate", level=100.0, server=False)
    assert csv_header([rate])[:4] == ["Request Rate", "Inferences/Second", "Client Send", "Client Recv"]
    assert csv_row(rate)[0] == "100"


def test_csv_rows_sorted_by_throughput(tmp_path):
    path = tmp_path / "out.csv"
    write_csv(str(path), [_result(level=4, ips=900.0), _result(level=1, ips=300.0), _result(level=2, ips=600.0)])
    rows = path.read_text().splitlines()
    assert [line.split(",")[0] for line in rows[1:]] == ["1", "2", "4"]
    assert summary_lines([_result()])[1] == "Concurrency: 1, throughput: 1234.57 infer/sec, latency 1500 usec"


def test_ranges_follow_perf_analyzer():
    assert parse_range("1", True) == [1]
    assert parse_range("1:16:5", True) == [1, 6, 11, 16]
    assert parse_range("2:4", True) == [2, 3, 4]
    assert parse_range("50:100:25", False) == [50.0, 75.0, 100.0]
    for bad in ("0", "4:2", "1:0", "a:b", "1:2:3:4"):
        with pytest.raises(UsageError):
            parse_range(bad, True)


def test_generated_data_follows_the_model_and_batch():
    [inputs] = request_data(MLP_META, 64, 4, {}, "zero")
    assert inputs[0].name == "INPUT0" and inputs[0].data.shape == (4, 256) and not inputs[0].data.any()
    [rand] = request_data(MLP_META, 64, 1, {}, "random")
    assert rand[0].data.shape == (1, 256) and rand[0].data.dtype == np.float32 and rand[0].data.any()
    with pytest.raises(InputDataError, match="max_batch_size"):
        request_data(MLP_META, 8, 16, {}, "zero")
    with pytest.raises(InputDataError, match="does not support batching"):
        request_data(MLP_META, 0, 2, {}, "zero")


def test_variable_dims_need_a_shape():
    meta = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [-1]}]}
    with pytest.raises(InputDataError, match="--shape X:1"):
        request_data(meta, 0, 1, {}, "random")
    [inputs] = request_data(meta, 0, 1, parse_shapes(["X:5"]), "random")
    assert inputs[0].data.shape == (5,)
    with pytest.raises(InputDataError, match="unknown inputs"):
        request_data(meta, 0, 1, parse_shapes(["Y:5"]), "random")


def test_json_input_data_in_perf_analyzers_format(tmp_path):
    meta = {"inputs": [{"name": "A", "datatype": "INT32", "shape": [-1, 4]},
                       {"name": "S", "datatype": "BYTES", "shape": [-1, 2]}]}
    packed = b"".join(len(s).to_bytes(4, "little") + s for s in (b"hi", b"there"))
    doc = {"data": [
        {"A": [1, 2, 3, 4], "S": ["a", "b"]},
        {"A": {"content": [5, 6, 7, 8], "shape": [4]}, "S": {"b64": base64.b64encode(packed).decode()}},
        {"A": {"b64": base64.b64encode(np.arange(4, dtype="<i4").tobytes()).decode()}, "S": ["x", "y"]},
    ]}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(doc))
    entries = request_data(meta, 8, 2, {}, str(path))
    assert len(entries) == 3
    np.testing.assert_array_equal(entries[0][0].data, [[1, 2, 3, 4]] * 2)
    np.testing.assert_array_equal(entries[1][0].data, [[5, 6, 7, 8]] * 2)
    assert list(entries[1][1].data[0]) == [b"hi", b"there"]
    np.testing.assert_array_equal(entries[2][0].data[0], [0, 1, 2, 3])
    path.write_text(json.dumps({"data": [{"A": [1, 2, 3, 4]}]}))
    with pytest.raises(InputDataError, match="no data for input S"):
        request_data(meta, 8, 1, {}, str(path))
    path.write_text(json.dumps({"data": [{"A": [1, 2, 3], "S": ["a", "b"]}]}))
    with pytest.raises(InputDataError, match="3 elements given"):
        request_data(meta, 8, 1, {}, str(path))
    path.write_text(json.dumps({"data": [[{"A": [1, 2, 3, 4]}]]}))
    with pytest.raises(InputDataError, match="data streams"):
        request_data(meta, 8, 1, {}, str(path))
