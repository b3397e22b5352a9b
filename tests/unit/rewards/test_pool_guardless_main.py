"""The scoring pool never imports the caller's main module again: a script without a `__main__` guard that scores
through the pool runs once (multiprocessing's forkserver and spawn starts re-ran it in every worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = '''
import os
with open(os.environ["IMPORTS_LOG"], "a") as log:
    log.write(__name__ + "\\n")

from verl_like.rewards.pool import ScoringPool

def exact(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)

pool = ScoringPool(exact, num_workers=2, timeout_s=30)
print([o.score for o in pool.map([dict(data_source="x", solution_str=s, ground_truth="1") for s in "121"])])
pool.close()
'''


def test_a_guardless_script_scoring_in_the_pool_runs_once(tmp_path):
    script, log = tmp_path / "score.py", tmp_path / "imports.log"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "IMPORTS_LOG": str(log)}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[1.0, 0.0, 1.0]"
    assert log.read_text().splitlines() == ["__main__"]
