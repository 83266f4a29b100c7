"""The HTML report of `tritond analyze`: one self-contained file (plots inline as SVG drawn by
matplotlib, no scripts, no external resources) that says what won, why, and what was tried."""
from __future__ import annotations

import html
import io
import re
from dataclasses import dataclass
from pathlib import Path

from .objective import Objective, pareto_front
from .outputs import batch_histogram
from .sweep import Point, Sweep, Trial

TOP_N = 10
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]


@dataclass
class Outcome:
    """What the sweep decided, as the report and the command's summary tell it."""

    winner: tuple[Trial, Point] | None
    confirmed: bool
    confirmation: list[tuple[Point, Point | None]]    # (winner, bundled config) measured alternately
    base: tuple[Trial, Point] | None
    config_path: Path | None
    runtime_s: float
    command: str
    server: str


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=96, layout="constrained")
    return fig, fig.add_subplot()


def _svg(fig) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "tritond"}):
        fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _ms(ns: int) -> float:
    return ns / 1e6


def pareto_plot(sweep: Sweep, winner: Point | None) -> str:
    o = sweep.objective
    fig, ax = _figure(8.0, 4.6)
    ranked = [t for t, _ in sweep.ranking()]
    shown = ranked[:len(PALETTE)]
    for trial in ranked[len(PALETTE):]:
        pts = sorted(trial.points, key=lambda p: p.concurrency)
        ax.plot([p.latency_ms for p in pts], [p.infer_per_sec for p in pts], "-o", color="#c8c8c8", ms=3, lw=0.8)
    for colour, trial in zip(PALETTE, shown):
        pts = sorted(trial.points, key=lambda p: p.concurrency)
        ax.plot([p.latency_ms for p in pts], [p.infer_per_sec for p in pts], "-o", color=colour, ms=4, lw=1.2,
                label=f"#{trial.id} {trial.candidate.label()}")
    front = pareto_front(sweep.points())
    if front:
        ax.step([p.latency_ms for p in front], [p.infer_per_sec for p in front], where="post", color="black",
                lw=2, ls="--", label="Pareto front", gid="pareto-front")
    if o.max_latency_ms is not None:
        ax.axvline(o.max_latency_ms, color="#d62728", ls=":", lw=1.5, label=f"limit {o.max_latency_ms:g} ms")
    if o.min_throughput is not None:
        ax.axhline(o.min_throughput, color="#d62728", ls=":", lw=1.5, label=f"floor {o.min_throughput:g}/s")
    if winner is not None:
        ax.plot([winner.latency_ms], [winner.infer_per_sec], "*", color="gold", mec="black", ms=18, label="winner",
                gid="winner-marker")
    ax.set_xlabel(f"p{o.percentile} latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return _svg(fig)


def batch_plot(base: Point | None, winner: Point | None) -> str:
    fig, ax = _figure(5.6, 3.6)
    series = [(label, p) for label, p in (("bundled config", base), ("winner", winner)) if p is not None]
    sizes = sorted({s for _, p in series for s in batch_histogram(p)})
    width = 0.8 / max(len(series), 1)
    for i, (label, p) in enumerate(series):
        hist = batch_histogram(p)
        total = sum(hist.values()) or 1
        xs = [j + i * width for j in range(len(sizes))]
        ax.bar(xs, [100.0 * hist.get(s, 0) / total for s in sizes], width, label=f"{label} (c={p.concurrency})",
               color=PALETTE[i])
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(sizes))], [str(s) for s in sizes])
    ax.set_xlabel("batch size formed by the server")
    ax.set_ylabel("share of executions (%)")
    ax.grid(alpha=0.3, axis="y")
    if series:
        ax.legend(fontsize=8)
    return _svg(fig)


def breakdown_plot(rows: list[tuple[str, Point]]) -> str:
    fig, ax = _figure(7.0, 0.45 * len(rows) + 1.4)
    parts = ["queue", "compute input", "compute infer", "compute output", "client + network"]
    colours = ["#ff7f0e", "#9edae5", "#1f77b4", "#aec7e8", "#c7c7c7"]
    labels = [label for label, _ in rows]
    values = []
    for _, p in rows:
        s, r = p.result.server, p.result
        if s is None:
            values.append([0, 0, 0, 0, _ms(r.avg_latency_ns)])
            continue
        server = [_ms(s.avg_queue_ns), _ms(s.avg_compute_input_ns), _ms(s.avg_compute_infer_ns),
                  _ms(s.avg_compute_output_ns)]
        values.append(server + [max(_ms(r.avg_latency_ns) - sum(server), 0.0)])
    left = [0.0] * len(rows)
    for k, (part, colour) in enumerate(zip(parts, colours)):
        widths = [v[k] for v in values]
        ax.barh(range(len(rows)), widths, left=left, color=colour, label=part)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("average request latency (ms)")
    ax.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    ax.grid(alpha=0.3, axis="x")
    return _svg(fig)


def _cell(value) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def _point_cells(p: Point, o: Objective) -> str:
    s = p.result.server
    cells = [p.concurrency, f"{p.infer_per_sec:,.1f}", f"{p.latency_ms:.2f}",
             f"{s.avg_batch_size:.1f}" if s else "", f"{_ms(s.avg_queue_ns):.2f}" if s else "",
             f"{_ms(s.avg_compute_ns):.2f}" if s else "",
             "" if p.memory_mb is None else f"{p.memory_mb:,.0f}",
             "yes" if o.feasible(p) else "; ".join(o.violations(p))]
    return "".join(_cell(c) for c in cells)


POINT_HEADINGS = ["concurrency", "infer/s", "p{pct} ms", "avg batch", "queue ms", "compute ms", "memory MB", "meets limits"]


def _headings(o: Objective, first: list[str]) -> str:
    return "".join(f"<th>{html.escape(h.format(pct=o.percentile))}</th>" for h in first + POINT_HEADINGS)


def explanation(sweep: Sweep, outcome: Outcome) -> list[str]:
    """Why the winner won, in sentences built from the measurements."""
    o = sweep.objective
    if outcome.winner is None:
        near = sweep.ranking()
        tail = f" The nearest was #{near[0][0].id} ({near[0][0].candidate.label()}): " \
               f"{'; '.join(o.violations(near[0][1]))}." if near else ""
        return [f"No configuration met the limits ({o.describe()}).{tail}"]
    trial, p = outcome.winner
    fmt = (lambda q: f"{q.infer_per_sec:,.1f} infer/s") if o.maximize == "throughput" else \
        (lambda q: f"{q.latency_ms:.2f} ms p{o.percentile}")
    out = [f"Objective: {o.describe()}. Among {len(sweep.points())} measured points of {len(sweep.trials)} "
           f"configurations, #{trial.id} ({trial.candidate.label()}) at concurrency {p.concurrency} did best: "
           f"{p.infer_per_sec:,.1f} infer/s with p{o.percentile} {p.latency_ms:.2f} ms."]
    if outcome.base is not None and outcome.base[0] is not trial:
        b = outcome.base[1]
        if o.feasible(b):
            out.append(f"The bundled config (#{outcome.base[0].id}) managed {fmt(b)} at its best concurrency "
                       f"{b.concurrency}: the winner is {o.gain(p, b):.2f}x on the objective.")
        else:
            out.append(f"The bundled config (#{outcome.base[0].id}) met no limit-respecting point "
                       f"({'; '.join(o.violations(b))} at best).")
    elif outcome.base is not None:
        out.append("The bundled config itself won: nothing tried beat it by a measurable margin.")
    feasible = [(t, q) for t, q in sweep.ranking() if o.feasible(q) and t is not trial]
    if feasible:
        t2, q2 = feasible[0]
        out.append(f"Runner-up: #{t2.id} ({t2.candidate.label()}) with {fmt(q2)} at concurrency {q2.concurrency}.")
    excluded = [q for q in sweep.points() if not o.feasible(q)]
    if excluded:
        top = max(excluded, key=lambda q: q.infer_per_sec)
        out.append(f"{len(excluded)} points broke a limit; the fastest of them ({top.infer_per_sec:,.1f} infer/s, "
                   f"#{top.config_id} at concurrency {top.concurrency}) did so with {'; '.join(o.violations(top))}.")
    s, bs = p.result.server, outcome.base[1].result.server if outcome.base else None
    if s is not None and bs is not None and s.inference_count:
        per_inf, base_per_inf = s.infer_ns_per_inference / 1000, bs.infer_ns_per_inference / 1000
        out.append(f"Server side, the winner formed batches of {s.avg_batch_size:.1f} on average (bundled: "
                   f"{bs.avg_batch_size:.1f}), spending {per_inf:.0f} µs of compute per inference (bundled: "
                   f"{base_per_inf:.0f} µs) and {_ms(s.avg_queue_ns):.2f} ms queued per request (bundled: "
                   f"{_ms(bs.avg_queue_ns):.2f} ms).")
    for reason in sweep.passed_over:
        out.append(f"Passed over: {reason}.")
    pairs = [(w, b) for w, b in outcome.confirmation if b is not None]
    if pairs:
        gains = [o.gain(w, b) for w, b in pairs]
        out.append("Measured again, alternating with the bundled config: " + "; ".join(
            f"winner {fmt(w)} (p{o.percentile} {w.latency_ms:.2f} ms) vs bundled {fmt(b)}" for w, b in pairs)
            + f": {sum(gains) / len(gains):.2f}x on average, the gain this report stands by.")
    elif outcome.confirmation:
        w = outcome.confirmation[-1][0]
        out.append(f"Measured again: {w.infer_per_sec:,.1f} infer/s, p{o.percentile} {w.latency_ms:.2f} ms — "
                   f"within the limits.")
    return out


STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:1.5em;margin-bottom:4px} h2{font-size:1.15em;margin-top:28px;border-bottom:1px solid #ddd}
.meta{color:#555;font-size:.9em} .winner{background:#f3f9f1;border:1px solid #9c9;border-radius:6px;padding:10px 16px}
.warn{background:#fff6e5;border:1px solid #e0b050;border-radius:6px;padding:10px 16px}
table{border-collapse:collapse;font-size:.85em;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4} td:nth-child(2){text-align:left} tr.win td{background:#fff8d0;font-weight:600}
figure{margin:12px 0} figcaption{font-size:.85em;color:#555} .row{display:flex;gap:16px;flex-wrap:wrap;align-items:flex-start}
svg{max-width:100%;height:auto} code{background:#f4f4f4;padding:1px 4px}
"""


def render(sweep: Sweep, outcome: Outcome, model: str) -> str:
    o = sweep.objective
    winner_point = outcome.winner[1] if outcome.winner else None
    base_point = outcome.base[1] if outcome.base else None
    ranking = sweep.ranking()
    e = html.escape
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>tritond analyze: {e(model)}</title><style>{STYLE}</style></head><body>",
             f"<h1>tritond analyze: <code>{e(model)}</code></h1>",
             f"<p class='meta'>{e(o.describe())} · {len(sweep.trials)} configurations, {len(sweep.points())} points · "
             f"{outcome.runtime_s / 60:.1f} min · server {e(outcome.server)}</p>",
             f"<p class='meta'><code>{e(outcome.command)}</code></p>"]
    if sweep.interrupted:
        parts.append("<p class='warn'>Interrupted: the sweep was stopped early; this report covers what was "
                     "measured until then.</p>")
    if outcome.winner is not None:
        trial, p = outcome.winner
        where = f"written to <code>{e(str(outcome.config_path))}</code>" if outcome.config_path else "not written"
        confirm = "" if outcome.confirmed else " <b>(not confirmed on rerun)</b>"
        parts.append(f"<div class='winner' id='winner'><b>Winner: #{trial.id} {e(trial.candidate.label())}</b>"
                     f" at concurrency {p.concurrency}: {p.infer_per_sec:,.1f} infer/s, p{o.percentile} "
                     f"{p.latency_ms:.2f} ms{confirm}. Config {where}.</div>")
    heading = "Why the winner won" if outcome.winner is not None else "Why there is no winner"
    parts.append(f"<h2>{heading}</h2><ul id='why'>" +
                 "".join(f"<li>{e(line)}</li>" for line in explanation(sweep, outcome)) + "</ul>")
    if sweep.points():
        parts.append(f"<figure id='pareto'>{pareto_plot(sweep, winner_point)}<figcaption>Throughput against "
                     f"p{o.percentile} latency, one line per configuration over its concurrency levels; the dashed "
                     f"step is the Pareto front (no point is both faster and lower-latency).</figcaption></figure>")
        bar_rows = [(f"#{t.id} {t.candidate.label()}", p) for t, p in ranking[:TOP_N]]
        if outcome.base is not None and all(t is not outcome.base[0] for t, _ in ranking[:TOP_N]):
            bar_rows.append((f"#{outcome.base[0].id} {outcome.base[0].candidate.label()}", outcome.base[1]))
        parts.append("<div class='row'>"
                     f"<figure id='batch-histogram'>{batch_plot(base_point, winner_point)}<figcaption>Batch sizes "
                     f"the server formed (statistics API), bundled config vs winner.</figcaption></figure>"
                     f"<figure id='latency-breakdown'>{breakdown_plot(bar_rows)}<figcaption>Where a request's time "
                     f"goes at each configuration's best point: server queue and compute (statistics API), the "
                     f"rest is client and network.</figcaption></figure></div>")
    parts.append(f"<h2>Top configurations</h2><table id='top-configs'><tr>{_headings(o, ['#', 'configuration'])}</tr>")
    for t, p in ranking[:TOP_N]:
        cls = " class='win'" if outcome.winner and t is outcome.winner[0] else ""
        parts.append(f"<tr{cls}>{_cell(t.id)}{_cell(t.candidate.label())}{_point_cells(p, o)}</tr>")
    parts.append("</table>")
    parts.append(f"<details><summary>All {len(sweep.points()) + len(sweep.reruns)} measured points</summary>"
                 f"<table id='all-points'><tr>{_headings(o, ['#', 'configuration', 'phase'])}</tr>")
    for p in sweep.points() + sweep.reruns:
        parts.append(f"<tr>{_cell(p.config_id)}{_cell(p.candidate.label())}{_cell(p.phase)}{_point_cells(p, o)}</tr>")
    parts.append("</table></details>")
    failed = [t for t in sweep.trials if t.problems]
    if failed:
        parts.append("<h2>Configurations not measured</h2><ul>" + "".join(
            f"<li>#{t.id} {e(t.candidate.label())}: {e('; '.join(t.problems))}</li>" for t in failed) + "</ul>")
    parts.append("</body></html>")
    return re.sub(r"\n\s*\n", "\n", "\n".join(parts))
