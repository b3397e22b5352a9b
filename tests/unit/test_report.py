import json

import pytest

from verl_like.report import main, render_report


def test_report_has_a_chart_per_present_metric_group(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "critic/score/mean": 0.1 * s, "response_length/mean": 5 + s, "timing_s/gen": 1.0} for s in range(1, 6)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = render_report(path, tmp_path / "r.html")
    page = out.read_text()
    assert page.count("<svg") == 3  # reward, length, phase times; no KL/entropy data, no chart
    assert "critic/score/mean (last 0.5)" in page
    assert "5 steps" in page


def test_cli_writes_beside_metrics_and_refuses_missing(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "critic/score/mean": 1.0}) + "\n")
    main([str(tmp_path)])
    assert (tmp_path / "report.html").exists()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nope")])
