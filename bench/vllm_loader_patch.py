"""The per-sync cost of pointing vLLM's TP-split parameters at our slice loaders (`VLLMSliceLoader`), with the
parameter lookup cached (what every sync after the first pays) and recomputed (what every sync paid before).

Starts an in-process vLLM engine on a tiny Qwen2 model of `--layers` layers (CPU build here; any device vLLM runs
on). On CPU, vLLM keeps linear weights repacked outside a reload cycle, so the timing runs inside one sync's
context; `layerwise` (vLLM's CPU-only buffering wrapper) is left out of the timed patch so that the number is the
work the CUDA path does.

    python bench/vllm_loader_patch.py                # 24 layers
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from verl_like.utils.device import is_cuda_available
    from verl_like.utils.env import apply_default_env

    apply_default_env("cuda" if is_cuda_available() else "cpu")
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl_like.models.tiny import TinyModelSpec, build_tiny_model
    from verl_like.shapes.decoder import DecoderShape
    from verl_like.resharding.plan import param_specs
    from verl_like.rollout.vllm_slice_loader import VLLMSliceLoader
    from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine

    model_dir = build_tiny_model(Path(tempfile.mkdtemp()) / "model", TinyModelSpec(num_hidden_layers=args.layers))
    engine = VLLMRolloutEngine(model_dir, VLLMEngineOptions(dtype="float32", max_model_len=256,
                                                            kv_cache_memory_bytes=64 << 20))
    config = AutoConfig.from_pretrained(model_dir)
    shape = DecoderShape.from_hf_config(config)
    named = [(n, tuple(p.shape)) for n, p in AutoModelForCausalLM.from_config(config).named_parameters()]
    specs = param_specs(named, shape, 4)
    loader = VLLMSliceLoader(engine.llm, specs, shape, 1)
    cached, recomputed = [], []
    with loader:  # one sync's context: vLLM's parameters in their loadable form
        loader._unpatch()
        layerwise, loader.layerwise = loader.layerwise, False
        for _ in range(args.repeats):
            start = time.perf_counter()
            loader._patch()
            loader._unpatch()
            cached.append(time.perf_counter() - start)
            loader._targets = None
            start = time.perf_counter()
            loader._patch()
            loader._unpatch()
            recomputed.append(time.perf_counter() - start)
        loader.layerwise = layerwise
        loader._patch()
    engine.shutdown()
    report = {"layers": args.layers, "params": len(specs), "cached_ms": statistics.median(cached) * 1e3,
              "recomputed_ms": statistics.median(recomputed) * 1e3}
    print(f"{len(specs)} parameters: patch + unpatch {report['cached_ms']:.2f} ms cached, "
          f"{report['recomputed_ms']:.2f} ms recomputed")
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
