"""Exports a training checkpoint to a Hugging Face model directory (safetensors, config, tokenizer).

    python -m verl_like.model_merger --local_dir RUN/checkpoints/global_step_N/actor --target_dir OUT
    python -m verl_like.model_merger merge --backend fsdp --local_dir ... --target_dir OUT     # verl's form

`--local_dir` is an FSDP engine checkpoint (the actor's or the critic's folder of a `global_step_N/`): sharded
DCP files written at any world size, plus the `huggingface/` folder with the model's config and tokenizer.
`--hf_model_path DIR` takes config and tokenizer from DIR instead (for checkpoints written without that folder).
No process group is needed: the shards are read in one process, on CPU.
A LoRA run's checkpoint (adapter only; model_merger_lora.py) exports `--export merged` (default: the base model
with the adapter merged in) or `--export adapter` (PEFT's layout); `--base_model_path` overrides the base model
directory the checkpoint names.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
import transformers
from transformers import AutoConfig

from verl_like.engine.fsdp_checkpoint import HF_FILES_DIR, TOKENIZER_FILES
from verl_like.utils.checkpoint import commit_directory, prepare_staging

logger = logging.getLogger(__name__)

MODEL_PREFIX = "model."  # save_fsdp_checkpoint stores {"model": ..., "optimizer": ...}


def _hf_source(local_dir: Path, hf_model_path: str | None) -> Path:
    source = Path(hf_model_path).expanduser() if hf_model_path else local_dir / HF_FILES_DIR
    if not (source / "config.json").is_file():
        raise FileNotFoundError(
            f"{source} has no config.json; pass --hf_model_path with the model directory the run trained "
            "(actor_rollout_ref.model.path), or a --local_dir that holds a huggingface/ folder"
        )
    return source


def load_model_state(local_dir: str | Path) -> dict[str, torch.Tensor]:
    """The full model state dict (HF names) of the FSDP checkpoint at `local_dir`, read in this process."""
    local_dir = Path(local_dir)
    if not (local_dir / ".metadata").is_file():
        raise FileNotFoundError(
            f"{local_dir} is not an FSDP checkpoint (no .metadata); pass a global_step_N/actor (or /critic) folder "
            "under trainer.default_local_dir/checkpoints"
        )
    metadata = dcp.FileSystemReader(str(local_dir)).read_metadata()
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith(MODEL_PREFIX) and hasattr(meta, "size")
    }
    if not state:
        raise ValueError(f"{local_dir}: the checkpoint holds no model tensors (keys starting with {MODEL_PREFIX!r})")
    dcp.load(state, checkpoint_id=str(local_dir), no_dist=True)
    return {key[len(MODEL_PREFIX):]: tensor for key, tensor in state.items()}


def _model_class(config: transformers.PretrainedConfig) -> type:
    for name in config.architectures or ():
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModelForCausalLM._model_mapping[type(config)]


def merge_fsdp_checkpoint(local_dir: str | Path, target_dir: str | Path, hf_model_path: str | None = None) -> Path:
    """Writes the HF model of the checkpoint at `local_dir` to `target_dir` (atomically); returns target_dir."""
    local_dir = Path(local_dir).expanduser()
    source = _hf_source(local_dir, hf_model_path)
    state = load_model_state(local_dir)
    config = AutoConfig.from_pretrained(source)
    cls = _model_class(config)
    with torch.device("meta"):
        model = cls(config)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise ValueError(
            f"{local_dir} does not match {cls.__name__} of {source}/config.json: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; pass the --hf_model_path of the model this checkpoint was trained from"
        )
    staging = prepare_staging(target_dir)
    model.save_pretrained(staging)
    for name in (*TOKENIZER_FILES, "generation_config.json"):
        if (source / name).is_file() and not (staging / name).exists():
            (staging / name).write_bytes((source / name).read_bytes())
    commit_directory(staging, target_dir)
    logger.info("merged %s (%s, %d tensors) into %s", local_dir, cls.__name__, len(state), target_dir)
    return Path(target_dir)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Both command shapes: `--local_dir .. --target_dir ..` and verl's `merge --backend fsdp --local_dir ..`."""
    if argv and argv[0] in ("merge", "test"):
        if argv[0] == "test":
            raise SystemExit("model_merger: verl's `test` mode is not supported; use `merge`")
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="python -m verl_like.model_merger", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="fsdp", choices=["fsdp"], help="only FSDP checkpoints exist here")
    parser.add_argument("--local_dir", required=True, help="global_step_N/actor (or /critic) of a run")
    parser.add_argument("--target_dir", required=True, help="where the HF model directory is written")
    parser.add_argument("--hf_model_path", default=None, help="config/tokenizer source (default: local_dir/huggingface)")
    parser.add_argument("--export", default="merged", choices=["merged", "adapter"],
                        help="LoRA checkpoints: the merged model, or the adapter alone in PEFT's layout")
    parser.add_argument("--base_model_path", default=None,
                        help="LoRA checkpoints: the base model (default: the one the checkpoint names)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    from verl_like.model_merger_lora import is_lora_checkpoint, merge_lora_checkpoint

    try:
        if is_lora_checkpoint(args.local_dir):
            merge_lora_checkpoint(args.local_dir, args.target_dir, args.export, args.base_model_path)
        else:
            merge_fsdp_checkpoint(args.local_dir, args.target_dir, args.hf_model_path)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"model_merger: {err}") from None


if __name__ == "__main__":
    main()
