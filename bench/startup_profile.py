"""Where a launch's first minute goes before any model runs: imports, Ray's start, CUDA's first touch.

Each probe runs in a fresh Python process (as a Ray worker would start), twice: the first run may still compile
bytecode into __pycache__, the second is what every later process pays. For the slowest import (vLLM after
everything the worker imported before it) it also writes Python's -X importtime tree (top modules by cumulative
time) and a cProfile of the import sorted by own time, which shows waits (subprocesses, sockets, sleeps) that a
module tree hides.

    python bench/startup_profile.py                      # every probe; RESULT line on stdout
    python bench/startup_profile.py --probes python,ray  # a subset (the CPU smoke test runs this)
    python bench/startup_profile.py --out DIR            # also DIR/importtime_vllm.txt and DIR/cprofile_vllm.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# name -> (setup statements, not timed; the timed statement). Setup runs first in the same process, so a probe's
# time is what its statement adds on top of what came before it in a worker's life.
PROBES: dict[str, tuple[str, str]] = {
    "python": ("", "pass"),
    "torch": ("", "import torch"),
    "cuda_init": ("import torch", "torch.zeros(1, device='cuda'); torch.cuda.synchronize()"),
    "ray": ("", "import ray"),
    "transformers": ("import torch", "import transformers"),
    "worker_module": ("import torch, transformers", "import verl_like.workers.actor_rollout"),
    "vllm": ("import verl_like.workers.actor_rollout", "import vllm"),
    "vllm_llm": ("import verl_like.workers.actor_rollout, vllm", "from vllm import LLM"),
    "ray_init": (
        "from verl_like.single_controller.cluster import init_ray\nimport ray",
        "init_ray(address='local', num_cpus=NUM_CPUS)",
    ),
}
NEEDS_CUDA = {"cuda_init"}
NEEDS_VLLM = {"vllm", "vllm_llm"}

_CHILD = """
import sys, time
{setup}
start = time.perf_counter()
{statement}
print("PROBE_SECONDS", time.perf_counter() - start, flush=True)
{teardown}
"""


def run_probe(name: str, num_cpus: int, extra_args: tuple[str, ...] = ()) -> tuple[float, float, str]:
    """(seconds of the probe's statement, seconds of the whole process, its stderr) from a fresh interpreter."""
    setup, statement = PROBES[name]
    teardown = "ray.shutdown()" if name == "ray_init" else ""
    code = _CHILD.format(setup=setup, statement=statement.replace("NUM_CPUS", str(num_cpus)), teardown=teardown)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *extra_args, "-c", code], capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"probe {name!r} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    seconds = next(float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("PROBE_SECONDS"))
    return seconds, wall, done.stderr


def importtime_top(stderr: str, top: int) -> list[tuple[float, str]]:
    """The `top` modules by cumulative import time (seconds, indented name) from -X importtime's stderr."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self, cumulative, name = line.split("|", 2)
        rows.append((int(cumulative) / 1e6, name.rstrip()))
    return sorted(rows, reverse=True)[:top]


def cprofile_report(name: str, num_cpus: int, top: int) -> str:
    """cProfile of the probe's statement, its `top` functions by own time (where waits show up)."""
    setup, statement = PROBES[name]
    code = (
        f"import cProfile, pstats, io\n{setup}\nprofile = cProfile.Profile()\nprofile.enable()\n"
        f"{statement.replace('NUM_CPUS', str(num_cpus))}\nprofile.disable()\nstream = io.StringIO()\n"
        f"pstats.Stats(profile, stream=stream).sort_stats('tottime').print_stats({top})\n"
        f"pstats.Stats(profile, stream=stream).sort_stats('cumulative').print_stats({top})\nprint(stream.getvalue())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"cProfile of {name!r} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probes", default=",".join(PROBES), help=f"comma-separated, of {list(PROBES)}")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each probe (the first may write bytecode)")
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1, help="ray_init's num_cpus")
    parser.add_argument("--out", default=None, help="directory for the vLLM import's importtime and cProfile")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()

    names = [name.strip() for name in args.probes.split(",") if name.strip()]
    unknown = [name for name in names if name not in PROBES]
    if unknown:
        parser.error(f"--probes: unknown {unknown}; choose from {list(PROBES)}")
    import importlib.util

    import torch

    skipped = {}
    if not torch.cuda.is_available():
        skipped.update({name: "no CUDA" for name in names if name in NEEDS_CUDA})
    if importlib.util.find_spec("vllm") is None:
        skipped.update({name: "vllm not installed" for name in names if name in NEEDS_VLLM})
    result: dict[str, object] = {"python_version": sys.version.split()[0], "cpus": os.cpu_count(), "skipped": skipped}
    for name in names:
        if name in skipped:
            continue
        runs = [run_probe(name, args.num_cpus) for _ in range(args.repeats)]
        result[name] = {"seconds": [round(s, 3) for s, _, _ in runs], "process_s": [round(w, 3) for _, w, _ in runs]}
        print(f"{name:>14}: {' '.join(f'{s:7.2f}' for s, _, _ in runs)} s  (process {runs[-1][1]:.2f} s)", flush=True)
    if args.out and "vllm" in names and "vllm" not in skipped:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        _, _, stderr = run_probe("vllm", args.num_cpus, ("-X", "importtime"))
        lines = [f"{seconds:8.3f} s  {module}" for seconds, module in importtime_top(stderr, args.top * 3)]
        (out / "importtime_vllm.txt").write_text("\n".join(lines) + "\n")
        (out / "cprofile_vllm.txt").write_text(cprofile_report("vllm_llm", args.num_cpus, args.top))
        (out / "cprofile_vllm_import.txt").write_text(cprofile_report("vllm", args.num_cpus, args.top))
        result["written"] = sorted(path.name for path in out.iterdir())
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
