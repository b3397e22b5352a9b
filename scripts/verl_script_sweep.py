"""Runs every example and recipe script of a verl checkout through verl_like's config validation (issue #31).

    python scripts/verl_script_sweep.py /path/to/verl [--out sweep.jsonl] [--show refused|error|all]

Each `*.sh` under examples/ and recipe/ that calls `verl.trainer.main_ppo` is run by bash with `python`,
`python3`, `ray`, `nvidia-smi`, `pip`, `huggingface-cli`, `hf`, `wget`, `curl` and `git` replaced by shims on
PATH, so the command line arrives exactly as bash expands it (variables, defaults, arrays, `$@` empty) and
nothing runs: the python shim records its argv and exits. Each script runs from the root of a scratch copy of the
checkout (as verl's READMEs run them; files they write land in the copy), HOME is a scratch directory. The main_ppo arguments
(after `-m verl.trainer.main_ppo`; `ray job submit ... -- python3 -m ...` is unwrapped) are then composed and
validated as `python -m verl_like.main_ppo ... trainer.dry_run=true` does, with `trainer.device=cuda` (the
scripts run on GPU machines; validation is machine-independent) and no path checks.

Each script ends in one class:
- accepted: composes and validates; every key is ours, translated, or taken with a noted reason;
- refused: a ConfigError before anything starts (its first line says what is not built, or which key is wrong);
- not-main_ppo: the script runs another entry point (SFT, generation, a recipe's own main) or none was captured;
- error: anything else (a bug here, or a script bash could not run).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

SHIMMED = ("ray", "nvidia-smi", "pip", "pip3", "huggingface-cli", "hf", "wget", "curl", "git", "modelscope")
PYTHON_SHIM = """#!/bin/sh
printf '%s\\0' "$@" > "$SWEEP_CAPTURE.$$"
exit 0
"""
MAIN = "verl.trainer.main_ppo"


def _write_shims(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        (bin_dir / name).write_text(PYTHON_SHIM)
    for name in SHIMMED:
        # `ray job submit ... -- python3 -m ...` hands its command to python's shim; the rest do nothing.
        body = '#!/bin/sh\nwhile [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done\n[ "$1" = "--" ] && shift && ' \
               'exec "$@"\nexit 0\n' if name == "ray" else "#!/bin/sh\nexit 0\n"
        (bin_dir / name).write_text(body)
    for path in bin_dir.iterdir():
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def capture(script: Path, root: Path, work: Path, timeout: float = 20.0) -> list[list[str]]:
    """Every python argv the script (under `root`, its cwd) would run, in order (empty when bash ran none)."""
    bin_dir = work / "bin"
    if not bin_dir.exists():
        _write_shims(bin_dir)
    run_dir = Path(tempfile.mkdtemp(dir=work))
    prefix = run_dir / "argv"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(run_dir / "home"), "SWEEP_CAPTURE": str(prefix),
           "USER": "sweep", "TERM": "dumb"}
    (run_dir / "home").mkdir()
    try:
        subprocess.run(["bash", str(script)], cwd=root, env=env, timeout=timeout, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        pass
    found = sorted(run_dir.glob("argv.*"), key=lambda p: p.stat().st_mtime)
    return [[a for a in p.read_bytes().decode(errors="replace").split("\0") if a] for p in found]


def main_ppo_args(argvs: list[list[str]]) -> list[str] | None:
    for argv in argvs:
        if "-m" in argv and argv.index("-m") + 1 < len(argv) and argv[argv.index("-m") + 1] == MAIN:
            return argv[argv.index("-m") + 2:]
    return None


def classify(args: list[str]) -> tuple[str, str, list[str]]:
    """(class, first line of the reason, notes or, when refused, each problem) for one main_ppo command line."""
    from verl_like.config.errors import ConfigError
    from verl_like.config.loader import load_config
    from verl_like.config.verl_compat import translate_overrides
    from verl_like.main_ppo import split_dry_run

    args, _ = split_dry_run(args)
    try:
        load_config([*args, "trainer.device=cuda"], check_paths=False)
        return "accepted", "", translate_overrides(args)[1]
    except ConfigError as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        problems = [line[2:] for line in lines[1:] if line.startswith("- ")] if "problems with" in lines[0] else []
        return "refused", lines[0], problems or [lines[0]]
    except Exception as exc:  # noqa: BLE001 - the sweep reports every failure, each with its type
        return "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", []


def _problem_key(problem: str) -> str:
    """The key (or flag) a refusal names first: what a user would have to change."""
    head = problem.removeprefix("unknown config key ").strip("'")
    return head.split("=")[0].split(" ")[0].split("'")[0].rstrip(",:")


def scripts(verl_root: Path) -> list[Path]:
    found = []
    for top in ("examples", "recipe"):
        found += [p for p in sorted((verl_root / top).rglob("*.sh")) if MAIN in p.read_text(errors="replace")]
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verl_root", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="one JSON record per script")
    parser.add_argument("--show", choices=("refused", "error", "all", "none"), default="refused")
    args = parser.parse_args(argv)
    quiet = logging.getLogger("verl_like")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the per-command notes are in the records
    try:
        records = _sweep(args.verl_root)
    finally:
        quiet.setLevel(level)
    _report(records, args.show)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in records))


def _sweep(verl_root: Path) -> list[dict]:
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "verl"
        shutil.copytree(verl_root, root, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        for script in scripts(root):
            rel = str(script.relative_to(root))
            ppo = main_ppo_args(capture(script, root, Path(tmp)))
            if ppo is None:
                records.append({"script": rel, "class": "not-main_ppo", "reason": "no main_ppo call captured"})
                continue
            kind, reason, notes = classify(ppo)
            records.append({"script": rel, "class": kind, "reason": reason, "notes": notes, "args": ppo})
    return records


def _report(records: list[dict], show: str) -> None:
    counts = collections.Counter(r["class"] for r in records)
    for record in records:
        if show == "all" or record["class"] == show:
            print(f"{record['class']:>12}  {record['script']}: {record['reason'][:240]}")
    problems = collections.Counter(_problem_key(p) for r in records if r["class"] == "refused" for p in r["notes"])
    problems.update(r["reason"][:120] for r in records if r["class"] == "error")
    print("\nproblems by key (refused scripts may have several):")
    for key, count in problems.most_common(25):
        print(f"  {count:3d}  {key}")
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + f" (of {len(records)} scripts)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
