"""Builds a tiny Qwen2-architecture causal LM and its character-level tokenizer into a local folder (no hub).

The tokenizer is a byte-level BPE with one token per character and no merges, built with exactly the pipeline of
transformers' `Qwen2Tokenizer` (NFC normalizer, Qwen2 split regex, ByteLevel pre-tokenizer and decoder). Why:
for `model_type == "qwen2"`, transformers 5.x's `AutoTokenizer` (and vLLM's loader, which calls it) ignores the
class saved in tokenizer_config.json and rebuilds a `Qwen2Tokenizer` from the vocab and merges it finds in
tokenizer.json. A tokenizer of any other shape (e.g. WordLevel) then encodes text to `[]`. Because ours already has
that exact shape, the rebuild yields the same tokenizer, in every process, with no patching of transformers.

Characters outside `ALPHABET` are dropped by the encoder (as `Qwen2Tokenizer`'s rebuild would drop them too);
`check_encodable(text)` raises on them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)

logger = logging.getLogger(__name__)

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, *ROLE_TOKENS)
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz +-*=?,.:()"

# Exactly transformers' Qwen2Tokenizer pre-tokenizer regex (see the module docstring for why it must match).
_QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Each turn is `<|role|>content<eos>`; the assistant's reply therefore ends in the eos token generation stops on.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('role must be system, user or assistant, got ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# The "tools" tokenizer (tiny tool-calling models, `synthetic:calc`): JSON's characters, Qwen's tool-call tags as
# single tokens, and a template whose tool turns are user turns wrapped in <tool_response> (as Qwen2.5 renders them).
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
TOOLS_ALPHABET = ALPHABET + '{}"_[]'
TOOLS_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|user|><tool_response>' + message['content'] + '</tool_response>' + eos_token }}"
    "{% elif message['role'] in ['system', 'user', 'assistant'] %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% else %}"
    "{{ raise_exception('role must be system, user, assistant or tool, got ' + message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
TOKENIZERS = ("chars", "tools")

_SPEC_FILE = "verl_like_tiny_spec.json"
# vLLM's CPU attention kernel refuses other head sizes ("Unsupported CPU attention configuration: head_dim=16").
_VLLM_CPU_HEAD_DIMS = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256})


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny Qwen2 model; `seed` fixes its random initial weights."""

    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False
    torch_dtype: str = "float32"
    seed: int = 0
    tokenizer: str = "chars"  # "chars" (the default job's) or "tools" (adds JSON characters and tool-call tags)

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer={self.tokenizer!r}; use one of {TOKENIZERS}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}"
            )
        head_dim = self.hidden_size // self.num_attention_heads
        if head_dim not in _VLLM_CPU_HEAD_DIMS:
            raise ValueError(
                f"hidden_size={self.hidden_size} / num_attention_heads={self.num_attention_heads} gives head_dim="
                f"{head_dim}; vLLM's CPU attention supports only {sorted(_VLLM_CPU_HEAD_DIMS)}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.torch_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"torch_dtype={self.torch_dtype!r}; use 'float32', 'bfloat16' or 'float16'")

    def spec_hash(self) -> str:
        """Stable hash of the spec and the tokenizer layout (a change in either invalidates a built folder)."""
        spec = dataclasses.asdict(self)
        layout = {"alphabet": ALPHABET, "special": SPECIAL_TOKENS, "chat_template": CHAT_TEMPLATE}
        if self.tokenizer == "chars":
            del spec["tokenizer"]  # folders built before the field existed stay valid
        else:
            layout = {"alphabet": TOOLS_ALPHABET, "special": SPECIAL_TOKENS + TOOL_TOKENS,
                      "chat_template": TOOLS_CHAT_TEMPLATE}
        payload = json.dumps({"spec": spec, **layout}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _byte_level_symbol(char: str) -> str:
    """The symbol the ByteLevel pre-tokenizer turns an ASCII character into (space -> 'Ġ')."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(char)[0][0]


def build_tokenizer(kind: str = "chars") -> PreTrainedTokenizerFast:
    """Character-level tokenizer over `ALPHABET` plus `SPECIAL_TOKENS`, with a system/user/assistant chat template.

    Ids: <pad>=0, <bos>=1, <eos>=2, <unk>=3, role tokens 4..6, then the characters in `ALPHABET` order.
    kind="tools": the tool-call tags (`TOOL_TOKENS`) follow the role tokens, the characters are `TOOLS_ALPHABET`,
    and the template renders tool turns (`TOOLS_CHAT_TEMPLATE`).
    """
    tools = kind == "tools"
    special = SPECIAL_TOKENS + (TOOL_TOKENS if tools else ())
    vocab = {token: i for i, token in enumerate(special)}
    for char in TOOLS_ALPHABET if tools else ALPHABET:
        vocab[_byte_level_symbol(char)] = len(vocab)
    backend = Tokenizer(
        BPE(vocab=vocab, merges=[], dropout=None, unk_token=None, continuing_subword_prefix="",
            end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        extra_special_tokens=list(ROLE_TOKENS) + (list(TOOL_TOKENS) if tools else []),
        padding_side="left",
        model_max_length=TinyModelSpec.max_position_embeddings,
        chat_template=TOOLS_CHAT_TEMPLATE if tools else CHAT_TEMPLATE,
    )
    return tokenizer


def check_encodable(text: str, kind: str = "chars") -> None:
    """Raise ValueError naming the characters of `text` the tiny tokenizer cannot encode (it would drop them)."""
    alphabet = TOOLS_ALPHABET if kind == "tools" else ALPHABET
    for tag in TOOL_TOKENS if kind == "tools" else ():
        text = text.replace(tag, "")
    bad = sorted(set(text) - set(alphabet))
    if bad:
        raise ValueError(f"characters {bad} are not in the tiny tokenizer's alphabet {alphabet!r}; remove them")


def _model_config(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype=spec.torch_dtype,
    )


def write_folder_atomically(out_dir: Path, write: Callable[[Path], None], is_built: Callable[[], bool]) -> None:
    """`write(staging)` into a fresh folder beside `out_dir`, then renamed into place: concurrent builders never see a
    half-written folder, and one that loses the race keeps the other's identical build (`is_built()`)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        write(staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            os.rename(staging, out_dir)
        except OSError:
            if not is_built():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _built_hash(spec: TinyModelSpec, classifier: bool) -> str:
    # The causal LM keeps the plain spec hash (folders built before classifiers existed stay valid).
    return spec.spec_hash() + ("-classifier" if classifier else "")


def _is_built(out_dir: Path, spec: TinyModelSpec, classifier: bool = False) -> bool:
    spec_file = out_dir / _SPEC_FILE
    if not spec_file.is_file():
        return False
    return json.loads(spec_file.read_text()).get("hash") == _built_hash(spec, classifier)


def build_tiny_model(out_dir: str | os.PathLike, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write config.json, model.safetensors, generation_config.json and the tokenizer files to `out_dir`.

    Idempotent: returns at once when `out_dir` already holds a model built from the same spec. The folder is built
    beside `out_dir` and renamed into place, so concurrent builders never see a half-written model.
    """
    return _build(out_dir, spec, classifier=False)


def build_tiny_classifier(out_dir: str | os.PathLike, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Like `build_tiny_model`, but a `Qwen2ForSequenceClassification` with one output (a tiny reward model).

    Same tokenizer as the tiny policy; the score head is random like every other weight (seeded by `spec.seed`).
    """
    return _build(out_dir, spec, classifier=True)


def _build(out_dir: str | os.PathLike, spec: TinyModelSpec, classifier: bool) -> Path:
    out_dir = Path(out_dir)
    if _is_built(out_dir, spec, classifier):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (out_dir / _SPEC_FILE).is_file():
            raise FileExistsError(
                f"out_dir={str(out_dir)!r} exists and holds files that build_tiny_model did not write; "
                "pass an empty or new folder"
            )
        logger.info("rebuilding tiny model in %s: its spec changed", out_dir)

    tokenizer = build_tokenizer(spec.tokenizer)
    config = _model_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    if classifier:
        config.num_labels = 1
        model = Qwen2ForSequenceClassification(config).to(getattr(torch, spec.torch_dtype))
    else:
        model = Qwen2ForCausalLM(config).to(getattr(torch, spec.torch_dtype))
    generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )

    def write(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _SPEC_FILE).write_text(
            json.dumps({"hash": _built_hash(spec, classifier), "spec": dataclasses.asdict(spec)}, indent=2)
        )

    write_folder_atomically(out_dir, write, lambda: _is_built(out_dir, spec, classifier))
    logger.info("built tiny model (%d parameters) in %s", sum(p.numel() for p in model.parameters()), out_dir)
    return out_dir
