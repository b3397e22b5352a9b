"""Image prompts through vLLM servers: the wire format, the server's route and the client's side of it.

Our servers (`python -m verl_like.serve`) answer, beside the lean text route (server_generate.py):

    POST /verl_like/generate_images  {"prompt_token_ids": [int, ...], "images": [base64 PNG, ...],
                                      "params": {SamplingParams fields, as for /verl_like/generate}}
      -> {"prompt_token_ids": b64 int32, "samples": [as /verl_like/generate's]}
    GET  /verl_like/generate_images  -> {"version": 1}   (a server without it answers 404)

`prompt_token_ids` hold one placeholder per image (the dataset's `raw_prompt_ids`): vLLM expands each itself, and
an already expanded prompt would be expanded twice. One request carries one prompt's images for all its n samples
(`params["n"]`), so the server processes each image once per prompt. The answer's `prompt_token_ids` are the ids
vLLM ran, expanded; the client checks them against the trainer's `input_ids` and raises naming the row when they
differ ("image features and image tokens do not match"). The server removes the image placeholder from the
sampled vocabulary (`allowed_token_ids`), as the colocated engine does (rollout/vllm_vision.py): a sampled
placeholder has no image features and the trainer's forward (which masks the same logit) would fail.

A plain `vllm serve` has neither route; image prompts to it are refused (its OpenAI routes take text or chat
messages, not token ids with images).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import threading
from collections.abc import Callable, Sequence
from typing import Any

from verl_like.rollout.server_generate import VISION_ROUTE as ROUTE

VERSION = 1
_allowed: dict[int, list[int]] = {}  # this server process's sampled vocabulary without the placeholder, by engine


# ----- the wire -----

def encode_image(image: Any) -> str:
    """A PIL image as base64 of its lossless PNG bytes (the server decodes the same pixels)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_image(text: str) -> Any:
    """The inverse of `encode_image`: a loaded PIL image."""
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(text, validate=True)))
    image.load()
    return image


def request_body(prompt_ids: Sequence[int], images: Sequence[Any], params: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of one image request: `prompt_ids` with one placeholder per image of `images` (PIL)."""
    return {"prompt_token_ids": [int(t) for t in prompt_ids], "images": [encode_image(i) for i in images],
            "params": dict(params)}


def parse_body(body: dict[str, Any]) -> tuple[list[int], list[Any], dict[str, Any]]:
    """(prompt ids, PIL images, sampling params) of a request body; ValueError/KeyError/TypeError when malformed."""
    prompt = [int(token) for token in body["prompt_token_ids"]]
    images = [decode_image(text) for text in body["images"]]
    if not images:
        raise ValueError(f"{ROUTE} takes at least one image; send text prompts to /verl_like/generate")
    return prompt, images, dict(body.get("params") or {})


# ----- the server's route (called from server_generate.generate_route) -----

def check_placeholders(prompt: Sequence[int], images: int, image_token_id: int) -> None:
    """ValueError unless `prompt` holds exactly one placeholder per image (none expanded yet)."""
    found = sum(token == image_token_id for token in prompt)
    if found != images:
        raise ValueError(f"the prompt holds {found} image placeholder(s) (id {image_token_id}) for {images} "
                         "image(s); send one placeholder per image, unexpanded (raw_prompt_ids)")


def allowed_token_ids(model_config: Any) -> list[int]:
    """Every token id of the served model but its image placeholder (ValueError for a text model)."""
    key = id(model_config)
    if key not in _allowed:
        image_token_id = getattr(model_config.hf_config, "image_token_id", None)
        if not model_config.is_multimodal_model or image_token_id is None:
            raise ValueError(f"the server's model {model_config.model} takes no images (or names no "
                             "image_token_id; only image-token families such as Idefics3 / SmolVLM are supported)")
        _allowed[key] = [i for i in range(model_config.get_vocab_size()) if i != int(image_token_id)]
    return _allowed[key]


async def vision_route(request: Any) -> Any:
    """Serves ROUTE (module doc) through the server's engine client."""
    import uuid

    from starlette.responses import JSONResponse

    from verl_like.rollout.server_generate import encode_array, encode_output, generate_to_end, sampling_params
    from verl_like.rollout.server_lora import lora_request_for

    if request.method == "GET":
        return JSONResponse({"version": VERSION})
    engine = request.app.state.engine_client
    try:
        body = await request.json()
        prompt, images, params = parse_body(body)
        sampling = sampling_params(params, allowed_token_ids=allowed_token_ids(engine.model_config))
        check_placeholders(prompt, len(images), int(engine.model_config.hf_config.image_token_id))
        lora_request = lora_request_for(request.app, body.get("lora_name"))
    except (KeyError, TypeError, ValueError, OSError) as err:
        return JSONResponse({"error": f"bad {ROUTE} request: {type(err).__name__}: {err}"}, status_code=400)
    inputs = {"prompt_token_ids": prompt, "multi_modal_data": {"image": images}}
    # A ValueError: vLLM refused the inputs (an image it cannot read, too long a prompt): 400, no retry.
    final = await generate_to_end(engine, inputs, sampling, f"verl_like-mm-{uuid.uuid4().hex}", lora_request,
                                  bad_input=(ValueError,), route=ROUTE)
    if isinstance(final, JSONResponse):
        return final
    return JSONResponse({"prompt_token_ids": encode_array(list(final.prompt_token_ids), "<i4"),
                         "samples": encode_output(final)})


# ----- the client's side -----

def refuse_plain_server(client: Any) -> None:
    """Raises ServerError (a 4xx: not retried) when `client`'s server has no image route."""
    from verl_like.rollout.server_client import ServerError

    if not client.lean:
        raise ServerError(f"{client} is a plain `vllm serve` (no {ROUTE}): image prompts need our route; start the "
                          "server with `python -m verl_like.serve MODEL ...` or let the trainer start it "
                          "(leave actor_rollout_ref.rollout.server.address empty)", status=400)
    try:
        client.request("GET", ROUTE, timeout_s=10.0, resend_stale=True)
    except ServerError as err:
        if err.status != 404:
            raise
        raise ServerError(f"{client} has no {ROUTE} (a verl_like server older than image prompts); restart it with "
                          "this verl_like", status=400) from err


class ServerImages:
    """The client's image requests: one per prompt, images counted in `images_sent` (once per prompt whatever n)."""

    def __init__(self) -> None:
        self.images_sent = 0
        self._lock = threading.Lock()
        self._checked: set[str] = set()  # servers whose image route was seen

    def send(self, client: Any, body: dict[str, Any], expected: Sequence[int] | None, where: str,
             timeout_s: float | None = None) -> list[Any]:
        """The samples of one image request on `client`; `expected`: the trainer's expanded prompt ids, which
        the server's expansion must equal (ValueError naming `where` when it does not)."""
        from verl_like.rollout.vllm_server import lean_completions
        from verl_like.rollout.server_generate import decode_array

        if client.address not in self._checked:
            refuse_plain_server(client)
            self._checked.add(client.address)
        answer = client.request("POST", ROUTE, json=body, timeout_s=timeout_s, resend_stale=True)
        with self._lock:
            self.images_sent += len(body["images"])
        expanded = decode_array(answer["prompt_token_ids"], "<i4").tolist()
        if expected is not None and expanded != list(expected):
            raise ValueError(
                f"{where}: the server expanded the image prompt to {len(expanded)} tokens but the trainer's "
                f"input_ids hold {len(expected)}; the processor beside the tokenizer and the server's disagree on "
                "the image tokens (the trainer would score another sequence than the one sampled)")
        return [dataclasses.replace(sample, prompt_token_ids=expanded) for sample in lean_completions(answer)]

    def senders(self, prompts: Any, token_lists: list[list[int]], params: Callable[[int], dict[str, Any]]
                ) -> list[Callable[[Any, float], list[Any]] | None]:
        """Per prompt row, the `ServerPool.complete(send=...)` of its image request (None for a text row)."""
        from verl_like.data.vision import MULTI_MODAL_DATA, RAW_PROMPT_IDS

        columns = prompts.non_tensor_batch
        out: list[Callable[[Any, float], list[Any]] | None] = []
        for row, (data, raw) in enumerate(zip(columns[MULTI_MODAL_DATA], columns[RAW_PROMPT_IDS])):
            images = list((data or {}).get("image", ()))
            if not images:
                out.append(None)
                continue

            def send(client: Any, timeout_s: float, row: int = row, raw: Any = raw, images: list = images) -> Any:
                body = request_body(raw, images, params(row))  # encoded in the request's thread
                if client.lora_name is not None:  # a LoRA server refuses a request without its adapter
                    body["lora_name"] = client.lora_name
                return self.send(client, body, token_lists[row], f"rollout row {row}", timeout_s)

            out.append(send)
        return out
