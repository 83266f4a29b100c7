"""The pure parts of `tritond analyze`: candidates written into and read back from configs,
the search space, the objective and Pareto front, the pbtxt and the report's structure."""
import re
from html.parser import HTMLParser

import pytest
from google.protobuf import text_format

from tritond.analyze.objective import Objective, pareto_front
from tritond.analyze.outputs import config_text
from tritond.analyze.report import Outcome, render
from tritond.analyze.space import Candidate, Space, apply, default_space, from_config, mismatches
from tritond.analyze.sweep import Point, Sweep, Trial
from tritond.perf.engine import LevelResult, ServerStats
from tritond.repository.render import ModelConfig

SERVER_CONFIG = {  # as GET config renders a batching ONNX model (trimmed)
    "name": "mlp", "backend": "onnxruntime", "platform": "onnxruntime_onnx", "max_batch_size": 64,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [256]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [256]}],
    "dynamic_batching": {"preferred_batch_size": [64], "max_queue_delay_microseconds": 200,
                         "preserve_ordering": False},
    "instance_group": [{"name": "mlp_0", "kind": "KIND_CPU", "count": 1, "gpus": []}],
    "parameters": {"execution_timeout_seconds": {"string_value": "30"}},
}


def test_candidate_round_trips_through_a_config():
    base = from_config(SERVER_CONFIG)
    assert base == Candidate(instances=1, max_batch_size=64, dynamic=True, queue_delay_us=200)
    c = Candidate(instances=3, max_batch_size=16, dynamic=True, queue_delay_us=500, preferred=(8,), threads=2)
    cfg = apply(SERVER_CONFIG, c)
    assert from_config(cfg) == c
    assert cfg["parameters"]["execution_timeout_seconds"] == {"string_value": "30"}, "other parameters stay"
    assert cfg["dynamic_batching"]["preserve_ordering"] is False, "other batcher fields stay"
    off = apply(SERVER_CONFIG, Candidate(1, 64, dynamic=False))
    assert "dynamic_batching" not in off and from_config(off).dynamic is False
    assert mismatches(cfg, c) == []
    assert mismatches(SERVER_CONFIG, c) == [
        "instances: asked 3, server has 1", "max_batch_size: asked 16, server has 64",
        "max_queue_delay_us: asked 500, server has 200", "preferred_batch_size: asked 8, server has ",
        "intra_op_thread_count: asked 2, server has "]


def test_minimal_file_config_gets_an_instance_group():
    cfg = apply({"name": "m", "max_batch_size": 8}, Candidate(2, 8, False), default_kind="KIND_CPU")
    assert cfg["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]


def test_default_space_and_its_candidates():
    base = from_config(SERVER_CONFIG)
    space = default_space(base, "onnxruntime", cpus=2)
    assert space.instances == [1, 2]
    assert space.max_batch_sizes == [8, 16, 32, 64]
    assert space.threads == [1, 2]
    assert space.dimensions(base) == ["instances", "dynamic", "max_batch_size", "preferred", "threads"]
    dyn = space.candidates_for("dynamic", base)
    assert dyn[0] == Candidate(1, 64, False) and {c.queue_delay_us for c in dyn[1:]} == {100, 200, 500, 2000}
    small = Candidate(1, 8, True, 100)
    assert all(max(c.preferred or (0,)) <= 8 for c in space.candidates_for("preferred", small))
    grid = space.all_candidates()
    assert len(grid) == len(set(grid))
    assert all(not c.dynamic or all(p <= c.max_batch_size for p in c.preferred) for c in grid)


def test_non_batching_model_sweeps_instances_only():
    space = default_space(Candidate(1, 0, False), "python", cpus=4)
    assert space.dimensions(Candidate(1, 0, False)) == ["instances"]
    assert space.all_candidates() == [Candidate(i, 0, False) for i in (1, 2, 3, 4)]


class P:
    def __init__(self, ips, lat, mem=None):
        self.infer_per_sec, self.latency_ms, self.memory_mb = ips, lat, mem


def test_objective_ranks_feasible_points_first():
    o = Objective(max_latency_ms=10, memory_budget_mb=500)
    fast_but_slow = P(2000, 12)
    ok = P(1500, 9)
    heavy = P(1800, 5, mem=900)
    assert o.violations(fast_but_slow) == ["p99 12.00 ms > 10 ms"]
    assert o.violations(heavy) == ["memory 900 MB > 500 MB"]
    assert o.best([fast_but_slow, ok, heavy]) is ok
    assert o.better(ok, P(1480, 9), margin=0.03) is False
    assert o.better(ok, P(1400, 9), margin=0.03) is True
    lat = Objective(maximize="latency", min_throughput=1000)
    assert lat.best([P(900, 1), P(1200, 3), P(1100, 2)]).latency_ms == 2
    assert lat.gain(P(1100, 2), P(1200, 4)) == 2.0


def test_pareto_front_keeps_only_undominated_points():
    pts = [P(100, 1), P(90, 2), P(300, 3), P(250, 4), P(500, 8)]
    assert [(p.infer_per_sec, p.latency_ms) for p in pareto_front(pts)] == [(100, 1), (300, 3), (500, 8)]


def test_winning_pbtxt_changes_only_the_swept_fields(tmp_path):
    original = tmp_path / "config.pbtxt"
    original.write_text('name: "mlp"\nbackend: "onnxruntime"\nmax_batch_size: 64\n'
                        'dynamic_batching { max_queue_delay_microseconds: 200 }\n')
    c = Candidate(2, 32, True, 500, (16,), 2)
    text = config_text(c, SERVER_CONFIG, original, "chosen by a test")
    assert text.startswith("# chosen by a test\n")
    cfg = text_format.Parse(text, ModelConfig())
    assert cfg.max_batch_size == 32 and cfg.instance_group[0].count == 2
    assert cfg.instance_group[0].kind == ModelConfig().instance_group.add(kind="KIND_CPU").kind
    assert list(cfg.dynamic_batching.preferred_batch_size) == [16]
    assert cfg.parameters["intra_op_thread_count"].string_value == "2"
    assert not cfg.input, "auto-completed fields stay auto-completed"


def _point(trial: Trial, conc: int, ips: float, p99_ms: float) -> Point:
    server = ServerStats(success_count=10, success_ns=10_000_000, queue_count=10, queue_ns=2_000_000,
                         compute_input_count=10, compute_input_ns=100_000, compute_infer_count=10,
                         compute_infer_ns=5_000_000, compute_output_count=10, compute_output_ns=100_000,
                         inference_count=10, execution_count=5, execution_infer_ns=2_500_000, batches={1: 2, 4: 3})
    result = LevelResult("concurrency", conc, 1, 100, 10**9, ips, int(p99_ms * 5e5), 1,
                         {50: int(p99_ms * 4e5), 90: int(p99_ms * 8e5), 95: int(p99_ms * 9e5), 99: int(p99_ms * 1e6)},
                         10_000, 20_000, server, True, 3)
    return Point(trial.id, trial.candidate, conc, result, 99)


class _Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.found = [], []

    def handle_starttag(self, tag, attrs):
        self.stack.append((tag, dict(attrs).get("id")))
        self.found.append(tuple(self.stack))

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop()[0] != tag:
            pass


def test_report_is_self_contained_with_every_plot():
    sweep = Sweep(None, None, "mlp", SERVER_CONFIG, default_space(from_config(SERVER_CONFIG), "onnxruntime", 2),
                  Objective(max_latency_ms=10), display=None)
    base = Trial(0, from_config(SERVER_CONFIG))
    better = Trial(1, Candidate(2, 64, True, 500))
    for t, pts in ((base, [(1, 300, 2), (4, 800, 6), (8, 900, 14)]), (better, [(1, 280, 2.5), (4, 1200, 7)])):
        t.points = [_point(t, *x) for x in pts]
        sweep.trials.append(t)
    pair = (_point(better, 4, 1100, 8), _point(base, 4, 1000, 6))
    outcome = Outcome(winner=(better, better.points[1]), confirmed=True, confirmation=[pair, pair],
                      base=(base, base.points[1]), config_path=None, runtime_s=42,
                      command="tritond analyze -m mlp", server="test")
    page = render(sweep, outcome, "mlp")
    assert "<script" not in page and not re.search(r"(src|href)=[\"'](https?:|//)", page), "no external resources"
    dom = _Dom()
    dom.feed(page)
    paths = {tuple(i for _, i in chain if i) for chain in dom.found if chain[-1][0] in ("svg", "path")}
    for fig in ("pareto", "batch-histogram", "latency-breakdown"):
        assert any(fig in ids for ids in paths), f"figure {fig} has no inline SVG"
    assert any("pareto-front" in ids for ids in paths) and any("winner-marker" in ids for ids in paths)
    assert "1.50x on the objective" in page, "gain over the bundled config at its best feasible point"
    assert "1.10x on average, the gain this report stands by" in page
    assert page.count("<tr") >= 1 + 2


@pytest.mark.parametrize("dynamic,threads,dims", [
    ([True], [0], ["instances"]),
    ([False, True], [0], ["instances", "dynamic"]),
    ([True], [1], ["instances", "threads"]),          # one value, but not the base's own
])
def test_space_walks_dimensions_whose_values_differ_from_the_base(dynamic, threads, dims):
    space = Space(instances=[1, 2], max_batch_sizes=[64], dynamic=dynamic, queue_delays_us=[100],
                  preferred=[()], threads=threads)
    assert space.dimensions(Candidate(1, 64, True, 100)) == dims
