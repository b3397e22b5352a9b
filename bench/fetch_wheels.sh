#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with the wheels the GPU machine needs beside the device kit (docs/benchmarks.md):
# Python 3.12 wheels, no dependencies (the machine's image and the kit hold the rest). Run from the repo root on the
# dev machine; carry .whl in the device call that first sources bench/device_env.sh.
#   .whl/       hydra, omegaconf, antlr4 (built here: it ships only as a source archive), tensordict, pyvers, httpx,
#               the vLLM server's uvicorn / model-hosting-container-standards / jmespath, peft, accelerate
#   .whl/trl/   trl, datasets, multiprocess, liger-kernel (bench/trl_grpo_baseline.py; gpu_suite installs them apart)
set -euo pipefail
dest=${1:-.whl}
mkdir -p "$dest/trl"
get=(python3 -m pip download -q --python-version 3.12 --only-binary=:all: --no-deps --platform any
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
"${get[@]}" -d "$dest" tensordict==0.15.3 pyvers==0.2.3 hydra-core==1.3.8 omegaconf==2.3.1 httpx==0.28.1 \
  uvicorn==0.55.0 model-hosting-container-standards==0.1.16 jmespath==1.1.0 peft==0.21.2 accelerate==1.16.0
"${get[@]}" -d "$dest/trl" trl==1.16.0 datasets==5.2.0 multiprocess==0.70.19 liger-kernel==0.8.5
ls "$dest"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1 \
  || python3 -m pip wheel -q --no-deps -w "$dest" antlr4-python3-runtime==4.9.3
ls -1 "$dest" "$dest/trl"
