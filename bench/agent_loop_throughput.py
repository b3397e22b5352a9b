"""Agent-loop rollout benchmark (issue #26 §7): generated tokens/s of multi-turn agent loops on the in-process vLLM
engine against single-turn generation of the same number of tokens, and how busy the GPU is during each.

Each sample runs a scripted tool agent (a verl-style `AgentLoopBase` registered here): `--turns` assistant turns of
`--turn-tokens` sampled tokens (ignore_eos, so every run generates exactly the same count), each followed by a tool
call that takes `--tool-latency-s` (an asyncio sleep: a sandbox or an API answering) and inserts `--tool-tokens`
tokens (loss mask 0). It goes through what training runs: `AgentLoopRunner` (one asyncio task per sample, the
per-sample session that seeds and budgets each turn), `VLLMTokenGenerator` (requests added to the engine as each
turn is ready, the engine stepped in the event loop), and the trajectory batch. The baseline is
`VLLMRolloutEngine.generate` on the same prompts with `turns * turn_tokens` tokens per sample in one turn.

GPU busy fraction: `nvidia-smi`'s utilization.gpu (the share of each sample period in which a kernel ran), sampled
every 100 ms during each timed call; mean over the call. Goal (issue #26 §7): agent-loop tokens/s >= 0.8 x single
turn. Random weights of the named shape (no hub).

    python bench/agent_loop_throughput.py                                   # one GPU, Qwen2.5-0.5B shape
    python bench/agent_loop_throughput.py --tool-latency-s 0 0.5 --turns 4  # one engine, two tool latencies
    python bench/agent_loop_throughput.py --smoke                           # tiny model on CPU, a check that it runs
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from verl_like.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register
from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig
from verl_like.utils.device import is_cuda_available
from verl_like.utils.env import apply_default_env

SCRIPT = {"turns": 3, "turn_tokens": 128, "tool_tokens": 32, "tool_latency_s": 0.05}  # set by main()


@register("bench_scripted_tool_agent")
class ScriptedToolAgent(AgentLoopBase):
    """`turns` x (generate `turn_tokens`, then a scripted tool: wait `tool_latency_s`, insert `tool_tokens` ids)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        prompt_ids = list(kwargs["prompt_ids"])
        response, mask, log_probs = [], [], []
        tool_ids = [(17 + i) % 1000 + 10 for i in range(SCRIPT["tool_tokens"])]
        for turn in range(SCRIPT["turns"]):
            out = await self.server_manager.generate(
                prompt_ids=prompt_ids + response,
                sampling_params={**sampling_params, "max_tokens": SCRIPT["turn_tokens"], "ignore_eos": True})
            response += out.token_ids
            mask += [1] * len(out.token_ids)
            log_probs += out.log_probs
            if turn + 1 < SCRIPT["turns"]:
                await asyncio.sleep(SCRIPT["tool_latency_s"])
                response += tool_ids
                mask += [0] * len(tool_ids)
                log_probs += [0.0] * len(tool_ids)
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=response, response_mask=mask,
                               response_logprobs=log_probs, num_turns=2 * SCRIPT["turns"] - 1)


class GpuBusy:
    """Samples nvidia-smi's utilization.gpu every 100 ms between start() and stop() (None without a GPU)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.samples = []
        if not is_cuda_available():
            return
        device = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        self._proc = subprocess.Popen(
            ["nvidia-smi", "-i", device, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def stop(self) -> float | None:
        if self._proc is None:
            return None
        self._proc.terminate()
        self._proc.wait()
        self._thread.join(timeout=2)
        self._proc = None
        return statistics.mean(self.samples) / 100 if self.samples else None


def _weight_sync_bench():
    path = Path(__file__).with_name("weight_sync.py")
    spec = importlib.util.spec_from_file_location("weight_sync_bench", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def prompt_batch(rows: int, prompt_len: int, vocab_size: int, seed: int) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(10, min(vocab_size, 1000), (rows, prompt_len), generator=generator)
    return DataProto.from_dict(tensors=dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                            position_ids=torch.arange(prompt_len).expand(rows, -1).clone()))


def runner_for(model_dir: Path, prompt_len: int, response_len: int):
    from verl_like.config.loader import load_config
    from verl_like.experimental.agent_loop.runner import AgentLoopRunner, agent_config_view

    config = load_config([
        "actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true",
        "actor_rollout_ref.rollout.agent.default_agent_loop=bench_scripted_tool_agent",
        f"data.max_prompt_length={prompt_len}", f"data.max_response_length={response_len}",
        f"actor_rollout_ref.model.path={model_dir}",
    ])
    return AgentLoopRunner(agent_config_view(config), tokenizer=None)


def timed(fn, busy: GpuBusy) -> tuple[float, float | None, Any]:
    busy.start()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    return seconds, busy.stop(), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench = _weight_sync_bench()
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(bench.SHAPES))
    parser.add_argument("--rows", type=int, default=32, help="prompts per call")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=128)
    parser.add_argument("--tool-tokens", type=int, default=32)
    parser.add_argument("--tool-latency-s", type=float, nargs="+", default=[0.0, 0.05, 0.5],
                        help="one measurement per latency, all on one engine")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--workdir", default=None, help="where the random model is written (kept for reruns)")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, fp32, short turns")
    args = parser.parse_args()
    dtype = "bfloat16"
    if args.smoke:
        os.environ["VERL_LIKE_FORCE_CPU"] = "1"
        args.model, args.rows, args.n, args.prompt_len, args.turn_tokens, args.tool_tokens, args.repeats = (
            "tiny", 4, 2, 8, 8, 4, 1)
        dtype = "float32"
    SCRIPT.update(turns=args.turns, turn_tokens=args.turn_tokens, tool_tokens=args.tool_tokens)
    apply_default_env("cuda" if is_cuda_available() else "cpu")
    from verl_like.engine.shared import init_process_group_from_env

    bench._init_single_process_group()  # the in-process engine runs inside a torch.distributed world of one
    init_process_group_from_env()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="agent_loop_bench_"))
    model_dir = bench.build_random_model(bench.SHAPES[args.model], workdir / args.model)

    from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine

    response_len = args.turns * args.turn_tokens + (args.turns - 1) * args.tool_tokens
    max_model_len = args.prompt_len + response_len
    start = time.perf_counter()
    rollout = VLLMRolloutEngine(str(model_dir), VLLMEngineOptions(
        dtype=dtype, load_format="dummy", enforce_eager=args.smoke, max_model_len=max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=max(args.rows * args.n, 1)))
    engine_start_s = time.perf_counter() - start
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    prompts = prompt_batch(args.rows, args.prompt_len, vocab, seed=0)
    runner = runner_for(model_dir, args.prompt_len, response_len)
    generator = rollout.token_generator(max_model_len)
    agent_sampling = SamplingConfig(n=args.n, temperature=1.0, max_tokens=response_len, ignore_eos=True, seed=0)
    single_sampling = SamplingConfig(n=args.n, temperature=1.0, max_tokens=args.turns * args.turn_tokens,
                                     ignore_eos=True)
    sampled = args.rows * args.n * args.turns * args.turn_tokens
    common = {"model": args.model, "rows": args.rows, "n": args.n, "prompt_len": args.prompt_len,
              "turns": args.turns, "turn_tokens": args.turn_tokens, "tool_tokens": args.tool_tokens, "dtype": dtype,
              "sampled_tokens": sampled, "engine_start_s": engine_start_s,
              "device": torch.cuda.get_device_name(0) if is_cuda_available() else "cpu"}
    for latency in args.tool_latency_s:
        SCRIPT["tool_latency_s"] = latency
        report = {**common, "tool_latency_s": latency,
                  **measure(runner, rollout, generator, prompts, agent_sampling, single_sampling, sampled,
                            args.repeats)}
        print(f"{args.model}, tool latency {latency:g} s: agent loops {report['agent_loop_tokens_per_s']:,.0f} tok/s "
              f"vs single turn {report['single_turn_tokens_per_s']:,.0f} tok/s (ratio {report['ratio']:.3f}, {report['ratio_vs_lockstep']:.3f} with the tool time); GPU "
              f"busy {report['agent_loop_gpu_busy']} vs {report['single_turn_gpu_busy']}", flush=True)
        print("RESULT " + json.dumps(report), flush=True)
    rollout.shutdown()


def measure(runner, rollout, generator, prompts, agent_sampling, single_sampling, sampled: int, repeats: int) -> dict:
    """Agent loops and single-turn generation alternating, the first round of each dropped, medians."""
    busy = GpuBusy()
    agent, single = [], []
    for _ in range(repeats + 1):
        seconds, gpu, out = timed(lambda: runner.run_sync(prompts, agent_sampling, generator, 0), busy)
        assert int(out.batch["response_mask"].sum()) == sampled, "the agent loops sampled another token count"
        agent.append((seconds, gpu))
        seconds, gpu, out = timed(lambda: rollout.generate(prompts, single_sampling), busy)
        assert int(out.batch["response_mask"].sum()) == sampled
        single.append((seconds, gpu))

    def median(rows, index):
        values = [row[index] for row in rows[1:] if row[index] is not None]
        return statistics.median(values) if values else None

    agent_s, single_s = median(agent, 0), median(single, 0)
    # Every sample here ends its turns on the same engine step (same lengths), so each tool call stalls them all:
    # (turns - 1) x latency is on the critical path of any engine; `ratio_vs_lockstep` leaves it out.
    lockstep_s = single_s + (SCRIPT["turns"] - 1) * SCRIPT["tool_latency_s"]
    return {"agent_loop_s": agent_s, "single_turn_s": single_s, "agent_loop_tokens_per_s": sampled / agent_s,
            "single_turn_tokens_per_s": sampled / single_s, "ratio": single_s / agent_s,
            "ratio_vs_lockstep": lockstep_s / agent_s, "agent_loop_s_all": [row[0] for row in agent],
            "single_turn_s_all": [row[0] for row in single],
            "agent_loop_gpu_busy": median(agent, 1), "single_turn_gpu_busy": median(single, 1)}


if __name__ == "__main__":
    main()
