#!/usr/bin/env bash
# The GPU benchmarks and tests behind docs/benchmarks.md, in stages that each fit one 10-minute device call.
# Run from the repo root on a machine with 2 H200s (one-GPU runs take GPU 0 or 1; two of them run side by side),
# with vllm, ray and this repo's other needs importable (shared/devicekit + the wheels in .whl/, see
# docs/benchmarks.md). Logs and RESULT lines go to $OUT (default ./gpu_out).
#
#   bash bench/gpu_suite.sh micro      # update MFU, raw-vs-worker rollout, weight sync (1 GPU, TP=2), sleep/wake
#   bash bench/gpu_suite.sh tests      # tests/gpu (TP=1 and TP=2, main_ppo on 1 and 2 GPUs); 7B sync at TP=2
#   bash bench/gpu_suite.sh steps      # whole GRPO steps: 0.5B then 1.5B on GPU 0, 7B (offloaded) on GPU 1
#   bash bench/gpu_suite.sh steps_tp2  # whole GRPO steps: 0.5B with rollout TP=2 on both GPUs
#   bash bench/gpu_suite.sh rerun      # one call: varlen update, 0.5B + 1.5B steps, tests/gpu, 7B sync
#   bash bench/gpu_suite.sh kernels    # varlen kernel test, our sync's per-parameter cost (torch only, no vLLM/Ray)
#   bash bench/gpu_suite.sh one_gpu    # GPU 0: TP=1 tests, main_ppo, 1.5B step | GPU 1: 7B step, eager launch, rollout
#   bash bench/gpu_suite.sh two_gpu    # 0.5B steps at TP=2, the TP=2 tests, 7B sync at TP=2, main_ppo on 2 GPUs
# One H200 (issue #14 TRL workload; issue #15 Megatron):
#   bash bench/gpu_suite.sh async_1gpu     # colocated synchronous vs server on the same GPU at staleness 1 (CUDA IPC)
#   bash bench/gpu_suite.sh megatron_1gpu  # GRPO step with the Megatron actor (resharding = its sync), GPU test, 1.5B
#   bash bench/gpu_suite.sh server_1gpu    # server on the same GPU at staleness 0 (CUDA IPC), the server-mode GPU test
#   bash bench/gpu_suite.sh logprobs_1gpu  # fused log-prob kernels: GPU test, profiled update with/without, the step
#   bash bench/gpu_suite.sh async_partial_1gpu  # staleness 1 with partial rollouts; the server-mode GPU test
#   bash bench/gpu_suite.sh fused_layers_1gpu   # use_fused_kernels: GPU tests, profiled update with/without, the step
#   bash bench/gpu_suite.sh trl_1gpu       # TRL's GRPOTrainer (vLLM colocate) and our colocated step, same workload
#                                          # (installs .whl/trl/*.whl into /tmp/trl_extra first)
#   bash bench/gpu_suite.sh startup_1gpu   # imports, ray.init, CUDA's first touch (bench/startup_profile.py)
#   bash bench/gpu_suite.sh bytecode       # compiles the kit's and this repo's bytecode once, as pip does at install
#                                          # (the kit ships none; with PYTHONDONTWRITEBYTECODE set every process
#                                          # would compile vLLM, Ray and transformers from source again)
#   bash bench/gpu_suite.sh launch_1gpu    # launch -> first rollout on the TRL workload: a first run (fills vLLM's
#                                          # compile cache), then two more; the step's start-up split in each
#   LORA_SHAPES="0.5b 1.5b" bash bench/gpu_suite.sh lora_1gpu  # issue #28: LoRA rank 32 against full fine-tuning
#                                          # on the TRL workload, per shape (LORA_FULL=0: the LoRA run only)
#   bash bench/gpu_suite.sh server_lora_1gpu  # issue #28: LoRA adapter-only sync into a server on the trainer's GPU
#   bash bench/gpu_suite.sh decode_knobs_1gpu # issue #30: raw vLLM decode under engine knobs
#   bash bench/gpu_suite.sh qwen25vl_1gpu  # issue #29: the Qwen2.5-VL GPU test, then 2 GRPO steps of a Qwen2.5-VL-
#                                          # shaped model on image prompts (bench/vlm_step.py; VLM_SHAPE picks the shape)
#   bash bench/gpu_suite.sh defaults_1gpu  # issue #30 goal 2: the TRL workload with the defaults (no budget or
#                                          # fused-kernel flag: auto fused kernels, budgets sized from free memory),
#                                          # then the fused + 65,536 run it is compared with, same hold; GPU test
#   bash bench/gpu_suite.sh ratios_a  # issue #30 goal 1, one hold of three calls (a, b, c back to back): TRL 0.5B
#   bash bench/gpu_suite.sh ratios_b  # (3 configurations) and our 0.5B sync | our 0.5B staleness 1, TRL 1.5B, our
#   bash bench/gpu_suite.sh ratios_c  # 1.5B sync | our 1.5B staleness 1, the defaults' GPU tests
#   bash bench/gpu_suite.sh ratios_7b_trl  # then ratios_7b_ours: TRL 7B (bf16 weights) and our 7B sync, one call each
#   bash bench/gpu_suite.sh ratios2_a  # issue #30 goal 1 on the KV-cache and no-log-prob defaults, one hold of three
#   bash bench/gpu_suite.sh ratios2_b  # calls: TRL 0.5B bf16, our 0.5B sync and staleness 1 with log_probs_from=
#   bash bench/gpu_suite.sh ratios2_c  # rescore | staleness 1 on the defaults (decode), TRL 1.5B bf16, our 1.5B sync
#                                      # | our 1.5B staleness 1 (rescore), the GPU tests of rescoring and the KV cache
#   bash bench/gpu_suite.sh ratios3_a  # the chunked LM head: its GPU tests, our 0.5B sync, TRL 1.5B, our 1.5B sync |
#   bash bench/gpu_suite.sh ratios3_b  # our 1.5B staleness 1 rescoring and decoding, TRL 0.5B, our 0.5B s1 rescoring
#   bash bench/gpu_suite.sh ratios_7b_trl  # then ratios_7b_ours_bf16 (one H200, needs_h200): goal 1's 7B row, both
#                                          # sides in bf16 weights and AdamW state on the GPU
#   bash bench/gpu_suite.sh ratios_7b_trl_sleep  # the same row on an 80 GiB H100: TRL's vLLM sleeps through the update
#   bash bench/gpu_suite.sh ratios_7b_skip  # then our 7B step on the defaults and with every row trained (same hold)
#   bash bench/gpu_suite.sh ratios_skip_05b  # TRL 0.5B (bf16, no IS), our 0.5B sync and staleness-1 steps on the
#   bash bench/gpu_suite.sh ratios_skip_15b  # defaults (zero-advantage rows skipped), then the same at 1.5B
#   bash bench/gpu_suite.sh ratios_7b_async1  # one H200: our 7B at staleness 1 (bf16 weights), then TRL 7B
#   bash bench/gpu_suite.sh ratios_trl_liger  # TRL 0.5B/1.5B with Liger's layer kernels, our 0.5B sync
#   bash bench/gpu_suite.sh budget_async_15b  # our 1.5B staleness 1 in bf16: token budget sized vs 32,768 (goal 3)
#   bash bench/gpu_suite.sh launch5_stacks  # issue #30 goal 4: colocated launches, cold then warm, whose Ray workers
#                                           # print their stacks every 2 s (the silent stretch after graph capture)
#   bash bench/gpu_suite.sh overlap_probe  # issue #30: vLLM's decode and the FSDP2 update in one process on two CUDA
#                                          # streams at once, against each alone (bench/inproc_overlap.py), 0.5B, 1.5B
#   DECODE_VARIANTS="no_logprobs kv_fit score_after" bash bench/gpu_suite.sh decode_knobs_1gpu  # KV sized to the
#     workload, and scoring finished sequences in one pass instead of per-step log-probs (issue #30 goals 1, 3)
set -uo pipefail
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
WORK=${BENCH_WORKDIR:-/tmp/bench_models}   # random-weight models are built once and reused across stages
mkdir -p "$WORK"

# Optional overall budget of one stage (seconds, SUITE_BUDGET_S): each run's limit is cut to what is left, and a
# run with under 60 s left is skipped, so a stage ends before the device call's own limit and keeps its logs.
SUITE_START=$SECONDS
BUDGET=${SUITE_BUDGET_S:-0}

# run NAME TIMEOUT GPUS CMD...: one benchmark, its log in $OUT/NAME.log, RESULT lines collected in $OUT/results.jsonl
run() {
  local name=$1 limit=$2 gpus=$3; shift 3
  if [ "$BUDGET" -gt 0 ]; then
    local left=$((BUDGET - (SECONDS - SUITE_START)))
    if [ "$left" -lt 60 ]; then
      echo "== $name skipped: $left s left of the stage's $BUDGET s"
      return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  local start=$SECONDS
  CUDA_VISIBLE_DEVICES=$gpus timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - start)) s (limit $limit s)"
  grep -h '^RESULT ' "$OUT/$name.log" | sed "s/^RESULT /{\"bench\": \"$name\", \"result\": /; s/\$/}/" >>"$OUT/results.jsonl"
  [ $rc = 0 ] || grep -v -e 'logging.cc' -e '^    @' "$OUT/$name.log" | tail -n 25
}

keep_server_logs() {  # the servers' own logs of every run under $WORK, named by run, into $OUT
  local log
  for log in "$WORK"/run_*/server_logs/*.log; do
    [ -f "$log" ] && cp "$log" "$OUT/$(basename "$(dirname "$(dirname "$log")")")_$(basename "$log")"
  done
}

PYTEST=(python -m pytest -v -s -rs -p no:cacheprovider)
export VERL_LIKE_GPU_LOG_DIR=$OUT VERL_LIKE_GPU_JOB_TIMEOUT_S=${VERL_LIKE_GPU_JOB_TIMEOUT_S:-240}

case "${1:-}" in
micro)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  {
    run update_sdpa 200 0 python bench/update_throughput.py --attn sdpa --steps 3 --warmup-steps 1 --workdir "$WORK"
    run update_flex 200 0 python bench/update_throughput.py --attn flex_attention --steps 3 --warmup-steps 1 \
      --workdir "$WORK"
    run rollout_0.5b 240 0 python bench/rollout_throughput.py --workdir "$WORK"
  } &
  {
    run sync_0.5b 150 1 python bench/weight_sync.py --model qwen2.5-0.5b --workdir "$WORK"
    run sync_7b 300 1 python bench/weight_sync.py --model qwen2.5-7b --workdir "$WORK"
    run update_padded 100 1 python bench/update_throughput.py --attn sdpa --padded --models qwen2.5-0.5b --steps 3 \
      --warmup-steps 1 --workdir "$WORK"
  } &
  wait
  run sync_0.5b_tp2 120 0,1 torchrun --nproc-per-node 2 bench/weight_sync.py --tp 2 --model qwen2.5-0.5b --workdir "$WORK"
  ;;
tests)
  run gpu_tests 400 0,1 python -m pytest tests/gpu -v -s -rs -p no:cacheprovider
  run sync_7b_tp2 170 0,1 torchrun --nproc-per-node 2 bench/weight_sync.py --tp 2 --model qwen2.5-7b --workdir "$WORK"
  ;;
steps)  # two Ray clusters side by side, one per GPU (started 20 s apart)
  {
    run step_0.5b 280 0 python bench/step_throughput.py --model qwen2.5-0.5b --workdir "$WORK"
    run step_1.5b 280 0 python bench/step_throughput.py --model qwen2.5-1.5b --workdir "$WORK"
  } &
  { sleep 20; run step_7b 560 1 python bench/step_throughput.py --model qwen2.5-7b --prompts 16 --offload-policy \
      --sleep-level 2 --workdir "$WORK"; } &
  wait
  ;;
steps_tp2)
  run step_0.5b_tp2 300 0,1 python bench/step_throughput.py --model qwen2.5-0.5b --gpus 2 --tp 2 --prompts 256 \
    --workdir "$WORK"
  ;;
rerun)  # what the first pass's fixes unblocked, in one call: varlen update, 0.5B/1.5B steps, tests, 7B sync
  {
    run update_varlen 120 0 python bench/update_throughput.py --attn varlen --steps 3 --warmup-steps 1 --workdir "$WORK"
    run step_0.5b 260 0 python bench/step_throughput.py --model qwen2.5-0.5b --workdir "$WORK"
  } &
  {
    run gpu_tests_1gpu 300 1 python -m pytest tests/gpu -v -s -rs -p no:cacheprovider -k "tp1 or 1gpu or varlen"
    run sync_7b 100 1 python bench/weight_sync.py --model qwen2.5-7b --repeats 3 --workdir "$WORK"
    run step_1.5b 300 1 python bench/step_throughput.py --model qwen2.5-1.5b --workdir "$WORK"
  } &
  wait
  run gpu_tests_2gpu 300 0,1 python -m pytest tests/gpu -v -s -rs -p no:cacheprovider -k "tp2"
  ;;
kernels)  # needs only torch (no vLLM, no Ray): the varlen attention kernel against per-sequence sdpa; sync overhead
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  run gpu_tests_varlen 150 0 "${PYTEST[@]}" tests/gpu/test_varlen_attention_gpu.py
  run sync_transfer_overhead 60 0 python bench/sync_transfer_overhead.py --device cuda
  ;;
one_gpu)  # one GPU each, side by side: TP=1 tests, the 1.5B step, main_ppo on GPU 0; 7B (FSDP2 CPU offload, vLLM
          # sleep level 2), the eager 0.5B launch, the rollout ratio on GPU 1 (later runs only where time is left)
  {
    run gpu_tests_tp1 200 0 "${PYTEST[@]}" tests/gpu/test_hybrid_engine_gpu.py -k tp1
    run step_1.5b 330 0 python bench/step_throughput.py --model qwen2.5-1.5b --steps 2 --workdir "$WORK"
    run gpu_tests_main_ppo_1gpu 260 0 "${PYTEST[@]}" tests/gpu/test_main_ppo_gpu.py -k 1gpu
  } &
  {
    sleep 20
    run step_7b 470 1 python bench/step_throughput.py --model qwen2.5-7b --prompts 16 --steps 2 --offload-policy \
      --sleep-level 2 --workdir "$WORK"
    run step_0.5b_eager 200 1 python bench/step_throughput.py --model qwen2.5-0.5b --eager --steps 1 --workdir "$WORK"
    run rollout_0.5b 200 1 python bench/rollout_throughput.py --workdir "$WORK"
  } &
  wait
  ;;
two_gpu)  # both GPUs: whole steps with rollout TP=2, the TP=2 tests, 7B sync at TP=2, main_ppo on two GPUs
  run step_0.5b_tp2 300 0,1 python bench/step_throughput.py --model qwen2.5-0.5b --gpus 2 --tp 2 --prompts 256 \
    --workdir "$WORK"
  run gpu_tests_tp2 200 0,1 "${PYTEST[@]}" tests/gpu/test_hybrid_engine_gpu.py -k tp2
  run sync_7b_tp2 150 0,1 torchrun --nproc-per-node 2 bench/weight_sync.py --tp 2 --model qwen2.5-7b --repeats 3 \
    --workdir "$WORK"
  run gpu_tests_main_ppo_2gpu 260 0,1 "${PYTEST[@]}" tests/gpu/test_main_ppo_gpu.py -k 2gpu
  ;;
async_1gpu)  # TRL's GRPO workload, one after the other on GPU 0 (same hold, so the two compare)
  TRL=(--prompts 32 --n 8 --prompt-len 128 --response-len 512)
  run step_trl_sync 230 0 python bench/step_throughput.py --model qwen2.5-0.5b "${TRL[@]}" --steps 5 \
    --gpu-memory-utilization 0.3 --workdir "$WORK"
  run step_trl_async1 320 0 python bench/step_throughput.py --model qwen2.5-0.5b "${TRL[@]}" --steps 5 \
    --mode server --staleness 1 --max-tokens-per-gpu 16384 --workdir "$WORK"
  ;;
megatron_1gpu)  # the Megatron actor (bf16, TP=1) through the whole step, its GPU test, the 1.5B update in bf16
  TRL=(--prompts 32 --n 8 --prompt-len 128 --response-len 512)
  run step_trl_megatron 260 0 python bench/step_throughput.py --model qwen2.5-0.5b "${TRL[@]}" --steps 5 \
    --gpu-memory-utilization 0.3 --strategy megatron --max-tokens-per-gpu 8192 --workdir "$WORK"
  run gpu_tests_megatron 120 0 "${PYTEST[@]}" tests/gpu/test_megatron_gpu.py
  run update_megatron_1.5b 170 0 python bench/update_throughput.py --models qwen2.5-1.5b --rows-per-rank 256 \
    --prompt-len 128 --response-len 512 --steps 3 --warmup-steps 1 --max-tokens-per-rank 4096 --strategy megatron \
    --workdir "$WORK"
  ;;
server_1gpu)  # server on the trainer's GPU, synchronous, CUDA IPC weights; then the server-mode GPU test
  TRL=(--prompts 32 --n 8 --prompt-len 128 --response-len 512)
  run step_trl_server_ipc 300 0 python bench/step_throughput.py --model qwen2.5-0.5b "${TRL[@]}" --steps 5 \
    --mode server --max-tokens-per-gpu 16384 --workdir "$WORK"
  run gpu_tests_server 260 0 "${PYTEST[@]}" tests/gpu/test_server_mode_gpu.py
  ;;
logprobs_1gpu)  # the fused log-prob kernels: their GPU test, the update with and without them (profiled), the step
  UPDATE=(python bench/update_throughput.py --models qwen2.5-0.5b --rows-per-rank 256 --prompt-len 128 \
    --response-len 512 --steps 3 --warmup-steps 1 --gradient-checkpointing --workdir "$WORK")
  run gpu_tests_token_log_probs 120 0 "${PYTEST[@]}" tests/gpu/test_token_log_probs_gpu.py
  run update_torch_logprobs_32k 150 0 env VERL_LIKE_FUSED_LOG_PROBS=0 "${UPDATE[@]}" --max-tokens-per-rank 32768 \
    --profile "$OUT/profile_torch_32k"
  run update_fused_32k 150 0 "${UPDATE[@]}" --max-tokens-per-rank 32768 --profile "$OUT/profile_fused_32k"
  run update_fused_64k 150 0 "${UPDATE[@]}" --max-tokens-per-rank 65536 --profile "$OUT/profile_fused_64k"
  run step_trl_sync_fused 260 0 python bench/step_throughput.py --model qwen2.5-0.5b --prompts 32 --n 8 \
    --prompt-len 128 --response-len 512 --steps 5 --gpu-memory-utilization 0.3 --workdir "$WORK"
  ;;
fused_layers_1gpu)  # use_fused_kernels (Triton RMSNorm and SwiGLU): GPU tests, update with/without, the step
  UPDATE=(python bench/update_throughput.py --models qwen2.5-0.5b --rows-per-rank 256 --prompt-len 128 \
    --response-len 512 --steps 3 --warmup-steps 1 --gradient-checkpointing --max-tokens-per-rank 65536 \
    --workdir "$WORK")
  run gpu_tests_fused_layers 150 0 "${PYTEST[@]}" tests/gpu/test_fused_layers_gpu.py
  run update_64k 120 0 "${UPDATE[@]}" --profile "$OUT/profile_64k"
  run update_64k_fused_layers 120 0 "${UPDATE[@]}" --fused-kernels --profile "$OUT/profile_64k_fused_layers"
  run step_trl_sync_64k_fused_layers 230 0 python bench/step_throughput.py --model qwen2.5-0.5b --prompts 32 --n 8 \
    --prompt-len 128 --response-len 512 --steps 5 --gpu-memory-utilization 0.3 --max-tokens-per-gpu 65536 \
    --override actor_rollout_ref.model.use_fused_kernels=true --workdir "$WORK"
  ;;
async_partial_1gpu)  # staleness 1 with partial rollouts (pause keep) on the trainer's GPU; the server GPU test
  run step_trl_async1_partial 320 0 python bench/step_throughput.py --model qwen2.5-0.5b --prompts 32 --n 8 \
    --prompt-len 128 --response-len 512 --steps 5 --mode server --staleness 1 --partial-rollout \
    --max-tokens-per-gpu 16384 --workdir "$WORK"
  run gpu_tests_server 260 0 "${PYTEST[@]}" tests/gpu/test_server_mode_gpu.py
  ;;
trl_1gpu)  # issue #14's ratio in one hold: TRL 1.16's GRPOTrainer, then our colocated step, same workload on GPU 0
  TRL=(--prompts 32 --n 8 --prompt-len 128 --response-len 512)
  if python -m pip install -q --no-deps --no-index --no-compile --target /tmp/trl_extra .whl/trl/*.whl \
      >"$OUT/trl_install.log" 2>&1; then
    # /tmp/trl_extra last: it holds only trl, datasets and multiprocess, and must not shadow the kit
    run trl_grpo 320 0 env PYTHONPATH="$PWD:${PYTHONPATH:+$PYTHONPATH:}/tmp/trl_extra" \
      python bench/trl_grpo_baseline.py "${TRL[@]}" --steps 5 --gpu-memory-utilization 0.3 --workdir "$WORK" \
      --out "$OUT/trl_grpo.json"
  else
    echo "== trl_grpo skipped: installing .whl/trl/*.whl failed (see trl_install.log)"; tail -n 5 "$OUT/trl_install.log"
  fi
  run step_trl_sync 230 0 python bench/step_throughput.py --model qwen2.5-0.5b "${TRL[@]}" --steps 5 \
    --gpu-memory-utilization 0.3 --workdir "$WORK"
  ;;
startup_1gpu)
  run startup_profile 400 0 python bench/startup_profile.py --repeats 1 --out "$OUT/startup"
  ;;
bytecode)
  start=$SECONDS
  for dir in ${DEVKIT_SITE:-/tmp/site} /tmp/extra "$PWD/verl_like"; do
    [ -d "$dir" ] && python -m compileall -q -j 0 "$dir" >/dev/null 2>&1
  done
  echo "== bytecode compiled in $((SECONDS - start)) s"
  ;;
launch_1gpu)
  LAUNCH=(python bench/step_throughput.py --model qwen2.5-0.5b --prompts 32 --n 8 --prompt-len 128 --response-len 512
    --gpu-memory-utilization 0.3 --max-tokens-per-gpu 65536 --workdir "$WORK")
  run launch_first 300 0 "${LAUNCH[@]}" --steps 2
  run launch_warm 200 0 "${LAUNCH[@]}" --steps 1
  run launch_warm2 200 0 "${LAUNCH[@]}" --steps 1
  ;;
launch3)  # issue #30 goal 4: launch -> first rollout in both placements, vLLM's compile cache cold, then warm
  LAUNCH=(python bench/step_throughput.py --model qwen2.5-0.5b --prompts 32 --n 8 --prompt-len 128 --response-len 512
    --gpu-memory-utilization 0.3 --workdir "$WORK")
  run launch_server_cold 220 0 "${LAUNCH[@]}" --mode server --staleness 1 --steps 2
  run launch_server_warm 180 0 "${LAUNCH[@]}" --mode server --staleness 1 --steps 2
  run launch_colocated_first 180 0 "${LAUNCH[@]}" --steps 1
  run launch_colocated_again 180 0 "${LAUNCH[@]}" --steps 1
  ;;
launch3_server)  # goal 4, server placement only, one step each; the servers' own logs kept (their start-up phases)
  LAUNCH=(python bench/step_throughput.py --model qwen2.5-0.5b --prompts 32 --n 8 --prompt-len 128 --response-len 512
    --gpu-memory-utilization 0.3 --workdir "$WORK" --mode server --staleness 1 --steps 1
    --override trainer.log_level=INFO)  # INFO: the servers' logs time their phases
  # what one interpreter spends importing the server's modules (the server imports them once before its engine)
  run import_vllm_server 60 0 python -c "import time; t = time.perf_counter(); \
import vllm.entrypoints.openai.api_server; print(f'RESULT {{\"import_api_server_s\": {time.perf_counter() - t:.2f}}}')"
  run launch_server_cold 180 0 "${LAUNCH[@]}"
  run launch_server_warm 150 0 "${LAUNCH[@]}"
  # the A/B of the engine core's start: fork (verl_like.serve's default on CPU only since this measured no gain)
  run launch_server_warm_fork 150 0 env VLLM_WORKER_MULTIPROC_METHOD=fork "${LAUNCH[@]}"
  keep_server_logs
  ;;
launch4)  # goal 4 in one hold: both placements, the compile cache cold then warm; a forked server's DEBUG log
  LAUNCH=(python bench/step_throughput.py --model qwen2.5-0.5b --prompts 32 --n 8 --prompt-len 128 --response-len 512
    --gpu-memory-utilization 0.3 --workdir "$WORK" --steps 1 --override trainer.log_level=INFO)
  run launch_colocated_cold 150 0 "${LAUNCH[@]}"
  run launch_colocated_warm 120 0 "${LAUNCH[@]}"
  run launch_server_cold 150 0 "${LAUNCH[@]}" --mode server --staleness 1
  run launch_server_warm 120 0 "${LAUNCH[@]}" --mode server --staleness 1
  run launch_server_fork_debug 120 0 env VLLM_WORKER_MULTIPROC_METHOD=fork "${LAUNCH[@]}" --mode server --staleness 1 \
    --override trainer.log_level=DEBUG
  keep_server_logs
  ;;
launch5_stacks)  # goal 4's lead: what the colocated worker runs in its silent ~19 s after vLLM's CUDA-graph capture.
  # A cold launch (it fills the compile caches) and a warm one, every Ray worker printing its main thread's stack
  # every 2 s (bench/stack_probe/sitecustomize.py; the samples land in each run's log).
  LAUNCH=(env STACK_PROBE_EVERY_S=2 RAY_DEDUP_LOGS=0 PYTHONPATH="$PWD/bench/stack_probe:$PYTHONPATH"
    python bench/step_throughput.py --model qwen2.5-0.5b --prompts 32 --n 8 --prompt-len 128 --response-len 512
    --gpu-memory-utilization 0.3 --workdir "$WORK" --steps 1 --override trainer.log_level=INFO)
  triton_cache() { find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -type f 2>/dev/null | wc -l; }
  echo "triton cache files before: $(triton_cache)"
  run launch_colocated_cold_stacks 150 0 "${LAUNCH[@]}"
  echo "triton cache files after the cold launch: $(triton_cache)"
  run launch_colocated_warm_stacks 150 0 "${LAUNCH[@]}"
  echo "triton cache files after the warm launch: $(triton_cache)"
  ;;
lora_1gpu)
  LORA_RUN=(--prompts 32 --n 8 --prompt-len 128 --response-len 512 --gpu-memory-utilization 0.3
    --max-tokens-per-gpu 65536 --override actor_rollout_ref.model.use_fused_kernels=true --steps 4 --workdir "$WORK")
  for shape in ${LORA_SHAPES:-0.5b}; do
    [ "${LORA_FULL:-1}" = 1 ] && run "step_${shape}_full" "${LORA_LIMIT:-290}" 0 python bench/step_throughput.py \
      --model "qwen2.5-$shape" "${LORA_RUN[@]}" --out "$OUT/step_${shape}_full.json"
    run "step_${shape}_lora32" "${LORA_LIMIT:-290}" 0 python bench/step_throughput.py --model "qwen2.5-$shape" "${LORA_RUN[@]}" \
      --lora-rank 32 --out "$OUT/step_${shape}_lora32.json"
  done
  ;;
server_lora_1gpu)  # issue #28: adapter-only LoRA sync into a vLLM server on the trainer's GPU (CUDA IPC base round)
  SERVER_LORA=(--model qwen2.5-0.5b --prompts 32 --n 8 --prompt-len 128 --response-len 512 --steps 4 --mode server
    --max-tokens-per-gpu 16384 --lora-rank 32 --workdir "$WORK")
  run step_server_lora32 300 0 python bench/step_throughput.py "${SERVER_LORA[@]}" --out "$OUT/step_server_lora32.json"
  run step_server_lora32_s1 300 0 python bench/step_throughput.py "${SERVER_LORA[@]}" --staleness 1 \
    --out "$OUT/step_server_lora32_s1.json"
  ;;
decode_knobs_1gpu)  # issue #30: raw vLLM decode on TRL's workload under engine knobs (async scheduling, core process...)
  run decode_knobs 540 0 python bench/vllm_decode_knobs.py --workdir "$WORK" ${DECODE_VARIANTS:+--variants $DECODE_VARIANTS}
  ;;
qwen25vl_1gpu)  # issue #29: Qwen2.5-VL image prompts: vLLM vs trainer log-probs (GPU test), then whole GRPO steps
  run qwen_vl_gpu_test 240 0 "${PYTEST[@]}" tests/gpu/test_qwen_vl_gpu.py
  run "step_${VLM_SHAPE:-qwen2.5-vl-0.5b-text}" "${VLM_LIMIT:-330}" 0 python bench/vlm_step.py \
    --shape "${VLM_SHAPE:-qwen2.5-vl-0.5b-text}" --steps "${VLM_STEPS:-2}" --workdir "$WORK" --timeout-s 300 \
    --out "$OUT/step_${VLM_SHAPE:-qwen2.5-vl-0.5b-text}.json"
  ;;
defaults_1gpu)  # issue #30 goal 2: what `python -m verl_like.main_ppo` gets on a GPU without extra flags
  TRL=(--model qwen2.5-0.5b --prompts 32 --n 8 --prompt-len 128 --response-len 512 --steps 5
    --gpu-memory-utilization 0.3 --workdir "$WORK")
  run gpu_tests_token_budget 150 0 "${PYTEST[@]}" tests/gpu/test_token_budget_gpu.py
  run step_trl_sync_defaults 260 0 python bench/step_throughput.py "${TRL[@]}" --out "$OUT/step_trl_sync_defaults.json"
  run step_trl_sync_64k_fused 260 0 python bench/step_throughput.py "${TRL[@]}" --max-tokens-per-gpu 65536 \
    --override actor_rollout_ref.model.use_fused_kernels=true --out "$OUT/step_trl_sync_64k_fused.json"
  ;;
overlap_probe)  # issue #30 staleness 1: what one process overlapping generation with the update could gain
  for shape in ${PROBE_SHAPES:-0.5b 1.5b}; do
    run "overlap_probe_$shape" 280 0 python bench/inproc_overlap.py --model "qwen2.5-$shape" --workdir "$WORK"
  done
  ;;
ratios_a|ratios_b|ratios_c|ratios_7b_trl|ratios_7b_trl_sleep|ratios_7b_ours|ratios2_a|ratios2_b|ratios2_c|ratios3_a|ratios3_b|ratios_7b_ours_bf16|ratios_7b_skip|ratios_skip_05b|ratios_skip_15b|ratios_7b_async1|ratios_trl_liger|budget_async_15b)
  # a: TRL 0.5B in its variants (fp32 master with its IS correction = its default; fp32 and bf16 weights without
  #    it = no old-log-prob forward), then our synchronous 0.5B step on the defaults
  # b: our staleness-1 0.5B step (server on the trainer's GPU), TRL 1.5B (fp32 master, no IS correction), our 1.5B
  # c: our staleness-1 1.5B step, TRL 1.5B in bf16 weights (its fastest at 0.5B), the defaults' GPU tests
  # 7b_trl / 7b_ours (two more calls, same hold): TRL 7B in bf16 weights without its IS correction (fp32 master
  #    weights and AdamW would take ~112 GiB before vLLM); ours 7B sync with the policy offloaded to host memory
  #    between its passes and vLLM's weights discarded while asleep (one H200 for both sides, goal 1's 7B row)
  TRL=(--prompts 32 --n 8 --prompt-len 128 --response-len 512 --steps "${RATIO_STEPS:-4}" --workdir "$WORK")
  OURS=(python bench/step_throughput.py "${TRL[@]}" --gpu-memory-utilization 0.3)
  # Staleness 1 on the defaults (budgets sized from free memory beside the server, whose KV cache is sized to what
  # it can hold, rollout.kv_cache_tokens=null); the 2026-12-04 hold ran it at --max-tokens-per-gpu 32768.
  ASYNC=(--mode server --staleness 1)
  RESCORE=(--override actor_rollout_ref.rollout.log_probs_from=rescore)
  BF16=(--override actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16)  # TRL's fastest precision
  # Our 7B as TRL's 7B row: bf16 weights and AdamW state on the GPU, vLLM's weights discarded while asleep
  BF16_7B=(--model qwen2.5-7b --sleep-level 2 --override actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16)
  trl_ready() {
    [ -d /tmp/trl_extra/trl ] || python -m pip install -q --no-deps --no-index --no-compile --target /tmp/trl_extra \
      .whl/trl/*.whl >"$OUT/trl_install.log" 2>&1
  }
  trl_run() {  # NAME MODEL LIMIT FLAGS...: TRL's GRPOTrainer (/tmp/trl_extra last on the path: it shadows nothing)
    local name=$1 model=$2 limit=$3; shift 3
    trl_ready || { echo "== $name skipped: installing .whl/trl failed"; tail -n 5 "$OUT/trl_install.log"; return; }
    run "$name" "$limit" 0 env PYTHONPATH="$PWD:${PYTHONPATH:+$PYTHONPATH:}/tmp/trl_extra" \
      python bench/trl_grpo_baseline.py --model "$model" "${TRL[@]}" --gpu-memory-utilization 0.3 "$@"
  }
  case "$1" in
  ratios_a)
    trl_run trl_0.5b_fp32_is qwen2.5-0.5b 200
    trl_run trl_0.5b_fp32 qwen2.5-0.5b 200 --no-is-correction
    trl_run trl_0.5b_bf16 qwen2.5-0.5b 200 --no-is-correction --model-dtype bfloat16
    run step_0.5b_sync 230 0 "${OURS[@]}" --model qwen2.5-0.5b
    ;;
  ratios_b)
    run step_0.5b_async1 280 0 "${OURS[@]}" --model qwen2.5-0.5b "${ASYNC[@]}"
    trl_run trl_1.5b_fp32 qwen2.5-1.5b 230 --no-is-correction
    run step_1.5b_sync 240 0 "${OURS[@]}" --model qwen2.5-1.5b
    ;;
  ratios2_a)  # TRL's fastest at 0.5B (2026-12-04 hold); ours synchronous on the defaults, staleness 1 rescoring
    trl_run trl_0.5b_bf16 qwen2.5-0.5b 200 --no-is-correction --model-dtype bfloat16
    run step_0.5b_sync 200 0 "${OURS[@]}" --model qwen2.5-0.5b
    run step_0.5b_async1_rescore 240 0 "${OURS[@]}" --model qwen2.5-0.5b "${ASYNC[@]}" "${RESCORE[@]}"
    ;;
  ratios2_b)  # staleness 1 on the defaults (the decode's log-probs: the A/B of rollout.log_probs_from); 1.5B
    run step_0.5b_async1 240 0 "${OURS[@]}" --model qwen2.5-0.5b "${ASYNC[@]}"
    trl_run trl_1.5b_bf16 qwen2.5-1.5b 200 --no-is-correction --model-dtype bfloat16
    run step_1.5b_sync 200 0 "${OURS[@]}" --model qwen2.5-1.5b
    ;;
  ratios2_c)
    run step_1.5b_async1_rescore 260 0 "${OURS[@]}" --model qwen2.5-1.5b "${ASYNC[@]}" "${RESCORE[@]}"
    run gpu_tests_rescore_kv 150 0 "${PYTEST[@]}" tests/gpu/test_rescore_gpu.py tests/gpu/test_kv_cache_gpu.py
    ;;
  ratios3_a)  # the chunked LM head (default on CUDA): its GPU tests, then memory and speed at 0.5B and 1.5B
    run gpu_tests_chunked_head 200 0 "${PYTEST[@]}" tests/gpu/test_chunked_head_gpu.py tests/gpu/test_token_budget_gpu.py \
      tests/gpu/test_token_log_probs_gpu.py
    run step_0.5b_sync 200 0 "${OURS[@]}" --model qwen2.5-0.5b
    trl_run trl_1.5b_bf16 qwen2.5-1.5b 200 --no-is-correction --model-dtype bfloat16
    run step_1.5b_sync 200 0 "${OURS[@]}" --model qwen2.5-1.5b
    ;;
  ratios3_b)  # 1.5B at staleness 1 both ways (rescored / decoded rollout log-probs), TRL 0.5B, 0.5B staleness 1
    run step_1.5b_async1_rescore 240 0 "${OURS[@]}" --model qwen2.5-1.5b "${ASYNC[@]}" "${RESCORE[@]}"
    run step_1.5b_async1 240 0 "${OURS[@]}" --model qwen2.5-1.5b "${ASYNC[@]}"
    trl_run trl_0.5b_bf16 qwen2.5-0.5b 200 --no-is-correction --model-dtype bfloat16
    run step_0.5b_async1_rescore 240 0 "${OURS[@]}" --model qwen2.5-0.5b "${ASYNC[@]}" "${RESCORE[@]}"
    ;;
  ratios_7b_trl)
    trl_run trl_7b_bf16 qwen2.5-7b 560 --no-is-correction --model-dtype bfloat16
    ;;
  ratios_7b_trl_sleep)  # an 80 GiB H100: TRL's bf16 weights, gradients and AdamW state (~61 GB) beside its vLLM's
    # 30 % (24 GB) pass 80 GB, so vLLM sleeps through the update (TRL's vllm_enable_sleep_mode, level 2), as ours does
    trl_run trl_7b_bf16_sleep qwen2.5-7b 560 --no-is-correction --model-dtype bfloat16 --vllm-sleep
    ;;
  ratios_7b_ours)
    run step_7b_sync 560 0 "${OURS[@]}" --model qwen2.5-7b --offload-policy --sleep-level 2
    ;;
  ratios_7b_ours_bf16)  # as TRL's 7B row: bf16 weights and AdamW state on the GPU (~61 GB: an H200), no offload;
    # vLLM discards its weights while asleep; the chunked head keeps the update's activations to a fifth of the GPU
    run step_7b_sync_bf16 560 0 "${OURS[@]}" "${BF16_7B[@]}"
    ;;
  ratios_7b_skip)  # ratios_7b_ours_bf16 on the defaults (rows whose advantage is 0 everywhere skip the update),
    # then with every row trained (actor.skip_zero_advantage_rows=false): the A/B of the skip, same hold
    run step_7b_sync_bf16 280 0 "${OURS[@]}" "${BF16_7B[@]}"
    run step_7b_sync_bf16_every_row 280 0 "${OURS[@]}" "${BF16_7B[@]}" \
      --override actor_rollout_ref.actor.skip_zero_advantage_rows=false
    ;;
  ratios_trl_liger)  # TRL with Liger's layer kernels (use_liger_kernel) against its fastest so far, 0.5B and 1.5B,
    # then our 0.5B synchronous step for the ratio in the same hold
    trl_run trl_0.5b_bf16_liger qwen2.5-0.5b 160 --no-is-correction --model-dtype bfloat16 --liger
    trl_run trl_1.5b_bf16_liger qwen2.5-1.5b 180 --no-is-correction --model-dtype bfloat16 --liger
    run step_0.5b_sync 120 0 "${OURS[@]}" --model qwen2.5-0.5b
    ;;
  budget_async_15b)  # goal 3 at staleness 1: our 1.5B in bf16 weights (TRL's precision) on the defaults, then with
    # the update's token budget at 32,768 instead of the one sized from free memory (step time against peak memory)
    run step_1.5b_async1_bf16 200 0 "${OURS[@]}" --model qwen2.5-1.5b "${ASYNC[@]}" "${BF16[@]}"
    run step_1.5b_async1_bf16_32k 200 0 "${OURS[@]}" --model qwen2.5-1.5b "${ASYNC[@]}" "${BF16[@]}" \
      --max-tokens-per-gpu 32768
    ;;
  ratios_7b_async1)  # one H200 (needs_h200): goal 1's 7B row at staleness 1, the server on the trainer's GPU beside
    # bf16 weights and AdamW state (~61 GB + the server's 30 %: no room on an 80 GiB H100), then TRL 7B without sleep
    run step_7b_async1_bf16 330 0 "${OURS[@]}" --model qwen2.5-7b "${BF16[@]}" "${ASYNC[@]}"
    trl_run trl_7b_bf16_liger qwen2.5-7b 230 --no-is-correction --model-dtype bfloat16 --liger
    ;;
  ratios_skip_05b)  # one call: TRL 0.5B at its fastest (bf16 weights, Liger's kernels: the 2026-12-08 hold), then
    # our 0.5B synchronous and staleness-1 steps on the defaults (rows whose advantage is 0 everywhere skip the update)
    trl_run trl_0.5b_bf16_liger qwen2.5-0.5b 160 --no-is-correction --model-dtype bfloat16 --liger
    run step_0.5b_sync 120 0 "${OURS[@]}" --model qwen2.5-0.5b
    run step_0.5b_async1 150 0 "${OURS[@]}" --model qwen2.5-0.5b "${ASYNC[@]}" "${RESCORE[@]}"
    ;;
  ratios_skip_15b)  # the same at 1.5B, the next call of the hold: TRL 1.5B, our sync and staleness-1 steps
    trl_run trl_1.5b_bf16_liger qwen2.5-1.5b 200 --no-is-correction --model-dtype bfloat16 --liger
    run step_1.5b_sync 150 0 "${OURS[@]}" --model qwen2.5-1.5b
    run step_1.5b_async1 200 0 "${OURS[@]}" --model qwen2.5-1.5b "${ASYNC[@]}"
    ;;
  ratios_c)
    run step_1.5b_async1 300 0 "${OURS[@]}" --model qwen2.5-1.5b "${ASYNC[@]}"
    trl_run trl_1.5b_bf16 qwen2.5-1.5b 200 --no-is-correction --model-dtype bfloat16
    run gpu_tests_defaults 260 0 "${PYTEST[@]}" tests/gpu/test_token_budget_gpu.py tests/gpu/test_main_ppo_gpu.py \
      tests/gpu/test_kv_cache_gpu.py
    ;;
  esac
  ;;
*)
  echo "usage: [SUITE_BUDGET_S=S] bash bench/gpu_suite.sh micro|tests|steps|steps_tp2|rerun|kernels|one_gpu|two_gpu|async_1gpu|megatron_1gpu|server_1gpu|logprobs_1gpu|async_partial_1gpu|fused_layers_1gpu|trl_1gpu|startup_1gpu|bytecode|launch_1gpu|lora_1gpu|server_lora_1gpu|decode_knobs_1gpu|qwen25vl_1gpu|defaults_1gpu|ratios_a|ratios_b|ratios_c|ratios_7b_trl|ratios_7b_ours|ratios2_a|ratios2_b|ratios2_c|ratios3_a|ratios3_b|ratios_7b_ours_bf16|ratios_7b_trl_sleep|ratios_7b_skip|ratios_skip_05b|ratios_skip_15b|ratios_7b_async1|ratios_trl_liger|budget_async_15b|launch3|launch3_server|launch4|launch5_stacks|overlap_probe" >&2
  exit 2
  ;;
esac
