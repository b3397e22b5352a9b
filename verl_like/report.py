"""Renders a run's metrics.jsonl into one self-contained HTML page of charts.

    python -m verl_like.report outputs/<project>/<experiment>            # writes report.html beside metrics.jsonl
    python -m verl_like.report path/to/metrics.jsonl -o /tmp/report.html

Works on a finished or a running run (it reads what has been written so far). No plotting library needed:
each chart is inline SVG.
"""

from __future__ import annotations

import argparse
import html
import math
from pathlib import Path
from typing import Any

from verl_like.utils.tracking import MEMORY_METRICS, read_metrics

# (title, metric keys) per chart; a chart whose keys are all absent is left out.
CHARTS: list[tuple[str, list[str]]] = [
    ("Reward (train score and validation)", ["critic/score/mean", "val/score/mean"]),
    ("Response length", ["response_length/mean", "response_length/max"]),
    ("KL", ["actor/kl_loss", "actor/ppo_kl", "critic/kl"]),
    ("Entropy", ["actor/entropy"]),
    ("Throughput (tokens/s)", ["perf/throughput", "perf/rollout_tokens_per_s"]),
    ("Phase times (s)", ["timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/values", "timing_s/update_critic", "timing_s/update_actor", "timing_s/sync_weights"]),
    ("Grad norm", ["actor/grad_norm", "critic/grad_norm"]),
    ("Memory of an actor worker (GiB)", [f"perf/{name}" for name in MEMORY_METRICS]),
]
_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
_W, _H, _PAD = 560, 260, 48


def _series(records: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [(float(r["step"]), float(r[key])) for r in records if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def _svg_chart(title: str, named: dict[str, list[tuple[float, float]]]) -> str:
    points = [p for s in named.values() for p in s]
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1)

    def sx(x: float) -> float:
        return _PAD + (x - x0) / (x1 - x0) * (_W - 2 * _PAD)

    def sy(y: float) -> float:
        return _H - _PAD + (y - y0) / (y1 - y0) * (2 * _PAD - _H)

    parts = [f'<svg width="{_W}" height="{_H}" xmlns="http://www.w3.org/2000/svg" font-size="11">',
             f'<text x="{_W / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
             f'<rect x="{_PAD}" y="{_PAD}" width="{_W - 2 * _PAD}" height="{_H - 2 * _PAD}" fill="none" stroke="#999"/>',
             f'<text x="{_PAD}" y="{_H - _PAD + 14}">{x0:g}</text>',
             f'<text x="{_W - _PAD}" y="{_H - _PAD + 14}" text-anchor="end">step {x1:g}</text>',
             f'<text x="{_PAD - 4}" y="{_H - _PAD}" text-anchor="end">{y0:.3g}</text>',
             f'<text x="{_PAD - 4}" y="{_PAD + 4}" text-anchor="end">{y1:.3g}</text>']
    for i, (key, series) in enumerate(named.items()):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in series)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{path}"/>')
        parts.append(f'<text x="{_PAD + 6}" y="{_PAD + 14 + 13 * i}" fill="{color}">{html.escape(key)} (last {series[-1][1]:.4g})</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_report(metrics_path: str | Path, output: str | Path) -> Path:
    """Writes the HTML report of `metrics_path` to `output` and returns its path."""
    records = read_metrics(metrics_path)
    if not records:
        raise ValueError(f"{metrics_path} has no metrics yet")
    charts = []
    for title, keys in CHARTS:
        named = {k: s for k in keys if (s := _series(records, k))}
        if named:
            charts.append(_svg_chart(title, named))
    last = records[-1]
    summary = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.5g}</td></tr>" for k, v in sorted(last.items()) if isinstance(v, (int, float)))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>verl_like run report</title></head><body>"
            f"<h2>verl_like run report</h2><p>{html.escape(str(metrics_path))}: {len(records)} steps</p>"
            f"<div style='display:flex;flex-wrap:wrap;gap:8px'>{''.join(charts)}</div>"
            f"<h3>Last step</h3><table border='1' cellpadding='3'>{summary}</table></body></html>")
    output = Path(output)
    output.write_text(page, encoding="utf-8")
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a run directory holding metrics.jsonl, or the metrics.jsonl file")
    parser.add_argument("-o", "--output", help="where to write the HTML (default: report.html beside metrics.jsonl)")
    args = parser.parse_args(argv)
    path = Path(args.run)
    metrics = path / "metrics.jsonl" if path.is_dir() else path
    if not metrics.exists():
        parser.error(f"{metrics} does not exist; pass a run directory or its metrics.jsonl")
    out = render_report(metrics, args.output or metrics.with_name("report.html"))
    print(out)


if __name__ == "__main__":
    main()
