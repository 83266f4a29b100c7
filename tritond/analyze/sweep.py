"""The sweep: each trial loads the model in the running server with a candidate config
(explicit load carrying `config`, no restart), reads the config back to check it took, then
measures it over rising concurrency with the `tritond perf` engine until more concurrency
stops paying; quick search walks one dimension at a time, brute force tries the grid."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tritond.perf.control import Control, ControlError
from tritond.perf.engine import LevelResult, MeasureError
from tritond.perf.progress import Display
from tritond.perf.session import PerfSession

from .objective import Objective
from .space import Candidate, Space, apply, from_config, mismatches

PLATEAU_GAIN = 0.05      # more concurrency must add 5% throughput to go on
SWITCH_MARGIN = 0.05     # quick search moves to a new value only for a 5% better objective
MAX_PASSES = 2
CONFIRM_TRIES = 3        # best configs measured again before one is declared the winner
CONFIRM_ROUNDS = 2       # winner / own-config pairs per try


@dataclass
class Point:
    """One configuration measured at one concurrency."""

    config_id: int
    candidate: Candidate
    concurrency: int
    result: LevelResult
    percentile: int
    memory_mb: float | None = None
    phase: str = "search"           # "search" | "rerun"

    @property
    def infer_per_sec(self) -> float:
        return self.result.infer_per_sec

    @property
    def latency_ms(self) -> float:
        return self.result.latency_ns(self.percentile) / 1e6


@dataclass
class Trial:
    """One candidate config: what the server reported after loading it, and its points."""

    id: int
    candidate: Candidate
    server_config: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def applied(self) -> bool:
        return bool(self.server_config) and not self.problems


class _Enough(Exception):
    """Raised from the per-level callback: more concurrency will not help this trial."""


@dataclass
class Sweep:
    control: Control
    session: PerfSession
    model: str
    base_config: dict
    space: Space
    objective: Objective
    display: Display
    memory: Callable[[], float | None] = lambda: None
    trials: list[Trial] = field(default_factory=list)
    reruns: list[Point] = field(default_factory=list)
    confirmation: list[tuple[Point, Point | None]] = field(default_factory=list)   # (winner, own config)
    passed_over: list[str] = field(default_factory=list)
    interrupted: bool = False
    _cache: dict[Candidate, Trial] = field(default_factory=dict)

    @property
    def base(self) -> Candidate:
        return from_config(self.base_config)

    def points(self) -> list[Point]:
        return [p for t in self.trials for p in t.points]

    def best_of(self, trial: Trial) -> Point | None:
        return self.objective.best(trial.points)

    # ---------------------------------------------------------------- one trial

    def load(self, c: Candidate) -> tuple[dict, list[str]]:
        """Load the model with candidate `c`; (config the server reports, problems)."""
        kind = ((self.base_config.get("instance_group") or [{}])[0]).get("kind", "KIND_CPU")
        try:
            self.control.load_model(self.model, apply(self.base_config, c, kind))
            config = self.control.model_config(self.model)
        except ControlError as e:
            return {}, [f"load failed: {e}"]
        return config, mismatches(config, c)

    def evaluate(self, c: Candidate) -> Trial:
        """Measure candidate `c` (once: repeated candidates come from the cache)."""
        c = c.normalized()
        if c in self._cache:
            return self._cache[c]
        trial = Trial(id=len(self.trials), candidate=c)
        self._cache[c] = trial
        self.trials.append(trial)
        started = time.monotonic()
        self.display.log(f"trial {trial.id}: {c.label()}")
        trial.server_config, trial.problems = self.load(c)
        if trial.problems:
            self.display.log(f"  not measured: {'; '.join(trial.problems)}")
        else:
            self._measure(trial, self.space.concurrency)
        trial.seconds = time.monotonic() - started
        self.display.trial_done()
        return trial

    def _measure(self, trial: Trial, levels: list[int], phase: str = "search") -> list[Point]:
        points: list[Point] = []
        label = ""

        def on_start(mode: str, level: float) -> None:
            nonlocal label
            label = f"trial {trial.id} · concurrency {int(level)}"
            self.display.level(label, self.session.opts.measure.max_trials)

        def on_window(done: int, total: int, ips: float, lat_ns: float, stable: bool) -> None:
            self.display.window(label, done, total, ips, lat_ns / 1e6, stable)

        def on_level(result: LevelResult) -> None:
            self.display.level_done()
            p = Point(trial.id, trial.candidate, int(result.level), result,
                      self.objective.percentile, self.memory(), phase)
            points.append(p)
            if phase == "search":
                trial.points.append(p)       # kept as measured, so Ctrl-C loses nothing
            flags = "" if result.stable else " (unstable)"
            bad = self.objective.violations(p)
            self.display.log(f"  c={p.concurrency}: {p.infer_per_sec:,.1f} infer/s, "
                             f"p{self.objective.percentile} {p.latency_ms:.2f} ms{flags}"
                             + (f" — {', '.join(bad)}" if bad else ""))
            if phase == "search" and self._enough(points):
                raise _Enough()

        try:
            self.session.run("concurrency", levels, on_start=on_start, on_window=on_window, on_level=on_level)
        except _Enough:
            pass
        except MeasureError as e:
            trial.problems.append(f"measurement failed: {e}")
            self.display.log(f"  measurement failed: {e}")
        return points

    def _enough(self, points: list[Point]) -> bool:
        """Whether higher concurrency can no longer improve the objective for this config."""
        last, o = points[-1], self.objective
        if o.max_latency_ms is not None and last.latency_ms > o.max_latency_ms:
            return True                  # latency only grows with concurrency
        if o.maximize == "latency" and (o.min_throughput is None or o.feasible(last)):
            return True                  # more concurrency only adds latency
        if len(points) >= 3:
            before = max(p.infer_per_sec for p in points[:-2])
            return max(p.infer_per_sec for p in points[-2:]) < before * (1 + PLATEAU_GAIN)
        return False

    # ---------------------------------------------------------------- searches

    def better(self, a: Trial, b: Trial, margin: float = SWITCH_MARGIN) -> bool:
        return self.objective.better(self.best_of(a), self.best_of(b), margin)

    def quick(self) -> None:
        """Coordinate descent from the model's own config: along each dimension in turn keep
        the best value (values in ascending order stop at the first that does not improve),
        and repeat while a pass changes something."""
        dims = self.space.dimensions(self.base)
        self.display.trials_total(1 + sum(max(len(self.space.candidates_for(d, self.base)) - 1, 0) for d in dims))
        current = self.evaluate(self.base)
        for _ in range(MAX_PASSES):
            moved = False
            for i, dim in enumerate(dims):
                options = self.space.candidates_for(dim, current.candidate)
                later = sum(max(len(self.space.candidates_for(d, current.candidate)) - 1, 0) for d in dims[i + 1:])
                self.display.trials_total(len(self._cache) + sum(o not in self._cache for o in options) + later)
                best, previous = current, None
                for option in options:
                    trial = self.evaluate(option)
                    if self.better(trial, best, margin=0.0):
                        best = trial
                    if dim in ("instances", "max_batch_size") and previous is not None \
                            and not self.better(trial, previous, margin=0.0):
                        break            # ascending values: past the knee
                    previous = trial
                if best is not current and self.better(best, current):
                    current, moved = best, True
            if not moved:
                break
        self.display.trials_total(len(self._cache))

    def brute(self) -> None:
        """Every candidate of the grid, the model's own config first."""
        grid = [self.base] + [c for c in self.space.all_candidates() if c != self.base]
        self.display.trials_total(len(grid))
        for c in grid:
            self.evaluate(c)

    # ---------------------------------------------------------------- result

    def ranking(self) -> list[tuple[Trial, Point]]:
        """Measured trials with their best point, best first."""
        ranked = [(t, self.best_of(t)) for t in self.trials if t.points]
        return sorted(ranked, key=lambda tp: self.objective.key(tp[1]), reverse=True)

    def rerun(self, trial: Trial, concurrency: int) -> Point | None:
        """Load `trial`'s config again and measure it once more at `concurrency`."""
        self.display.log(f"rerun of trial {trial.id} at concurrency {concurrency}")
        _, problems = self.load(trial.candidate)
        if problems:
            self.display.log(f"  not measured: {'; '.join(problems)}")
            return None
        points = self._measure(trial, [concurrency], phase="rerun")
        self.reruns.extend(points)
        return points[0] if points else None

    def confirm(self) -> tuple[Trial, Point] | None:
        """Measure the best feasible configs again, each alternating with the model's own config
        (CONFIRM_ROUNDS pairs): the first that still meets the limits every time and beats the
        model's own config on the pairs' mean wins. Pairs taken back to back see the same host
        load, where the search compared measurements taken minutes apart. The model's own config
        wins when nothing beats it."""
        o = self.objective
        base_trial = self.trials[0] if self.trials else None
        base_point = self.best_of(base_trial) if base_trial else None
        base_ok = base_point is not None and o.feasible(base_point)
        ranked = [(t, p) for t, p in self.ranking() if o.feasible(p)]
        tries = ranked[:CONFIRM_TRIES]
        if base_ok and all(t is not base_trial for t, _ in tries):
            tries.append((base_trial, base_point))
        for trial, point in tries:
            pairs = []
            for _ in range(CONFIRM_ROUNDS if trial is not base_trial else 1):
                w = self.rerun(trial, point.concurrency)
                if w is None or not o.feasible(w):
                    pairs.append((w, None))
                    break
                b = self.rerun(base_trial, base_point.concurrency) if base_ok and trial is not base_trial else None
                pairs.append((w, b))
            if any(w is None or not o.feasible(w) for w, _ in pairs):
                self.passed_over.append(f"#{trial.id} broke the limits when measured again")
                continue
            gains = [o.gain(w, b) for w, b in pairs if b is not None]
            if gains and sum(gains) / len(gains) < 1.0:
                self.passed_over.append(f"#{trial.id} did not beat the model's own config measured alternately "
                                        f"with it ({sum(gains) / len(gains):.2f}x)")
                continue
            self.confirmation = pairs
            return trial, point
        return None

    def restore(self) -> None:
        """Put the model's own config back (for a server analyze did not start)."""
        try:
            self.control.load_model(self.model, self.base_config)
        except ControlError as e:
            self.display.log(f"could not restore the model's own config: {e}")
