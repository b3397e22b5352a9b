# Source on the GPU machine from the repo root, after the device kit's env.sh (../shared/devicekit/README.md):
#   source .devkit/pN/env.sh && source bench/device_env.sh && bash bench/gpu_suite.sh STAGE
# A later call of the same warm hold that carries no kit piece (so has no env.sh) sources this file alone: it sets
# the kit's environment for the kit already unpacked in /tmp/site.
# Installs the wheels carried in .whl/ (hydra-core, omegaconf, antlr4, tensordict, pyvers, httpx and the vLLM
# server's uvicorn / model-hosting-container-standards / jmespath; docs/benchmarks.md) into /tmp/extra once per
# machine, puts this repo and /tmp/extra on the path after the kit, and compiles the kit's, the extras', this
# repo's and the device torch's bytecode once (the device sets PYTHONDONTWRITEBYTECODE: without it every process compiles them again).
_de_site=${DEVKIT_SITE:-/tmp/site}
if [ -f "$_de_site/.devicekit" ]; then
  case ":${PYTHONPATH:-}:" in *":$_de_site:"*) ;; *)
    export PYTHONPATH="$_de_site${PYTHONPATH:+:$PYTHONPATH}" PATH="$_de_site/bin:$PATH"
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_NO_USAGE_STATS=1 \
      DO_NOT_TRACK=1 RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0 ;;
  esac
fi
if [ ! -f /tmp/extra/.verl_like-extra ]; then
  python -m pip install -q --no-deps --no-index --no-compile --target /tmp/extra .whl/*.whl \
    && touch /tmp/extra/.verl_like-extra || echo "device_env: installing .whl/*.whl failed" >&2
fi
case ":${PYTHONPATH:-}:" in *":/tmp/extra:"*) ;; *) export PYTHONPATH="$PWD:${PYTHONPATH:+$PYTHONPATH:}/tmp/extra" ;; esac
if [ ! -f /tmp/extra/.verl_like-bytecode ]; then
  # the device's own torch ships without bytecode as well (verl_like warns at start-up when it finds none)
  for _de_dir in "$_de_site" /tmp/extra "$PWD/verl_like" "$(python -c 'import os, torch; print(os.path.dirname(torch.__file__))')"; do
    [ -d "$_de_dir" ] && python -m compileall -q -j 0 "$_de_dir" >/dev/null 2>&1
  done
  touch /tmp/extra/.verl_like-bytecode
fi
unset _de_dir _de_site
