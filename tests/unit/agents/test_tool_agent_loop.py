"""The tool agent loop's logic on a scripted policy (no engine): turns, masks, tool failures, truncation, seeds."""

import asyncio
import time

import numpy as np
import pytest
import torch

from verl_like.config.loader import load_config
from verl_like.experimental.agent_loop.runner import AgentLoopRunner, agent_config_view
from verl_like.experimental.agent_loop.tool_agent_loop import truncate_reply
from verl_like.models.tiny import build_tokenizer
from verl_like.protocol import DataProto
from verl_like.rollout.base import SamplingConfig
from verl_like.rollout.token_generate import TokenGenerator, TokenOutput
from verl_like.rollout.trajectory import LossMaskReason

TOK = build_tokenizer("tools")
TOOLS_MODULE = __name__
W = 256  # the response budget of every turn together


def flaky_tool(expression: str) -> str:
    """Raises on 'boom', sleeps on 'hang', else echoes.

    Args:
        expression: what to echo.
    """
    if expression == "boom":
        raise RuntimeError("sandbox died")
    if expression == "hang":
        time.sleep(5)
    return "x" * 100 if expression == "long" else expression


class Scripted(TokenGenerator):
    """Replies with a sample's next scripted turn (turn k after k earlier assistant turns in its prompt); records
    the prompts and sampling params it got."""

    max_model_len = 512

    def __init__(self, turns: list[str]) -> None:
        self.turns = turns
        self.seen: list[tuple[list[int], dict]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None):
        self.seen.append((list(prompt_ids), dict(sampling_params)))
        turn = TOK.convert_ids_to_tokens(list(prompt_ids)).count("<|assistant|>") - 1
        text = self.turns[min(turn, len(self.turns) - 1)]
        ids = TOK.encode(text, add_special_tokens=False) + [TOK.eos_token_id]
        await asyncio.sleep(0)
        limit = sampling_params["max_tokens"]  # as an engine does
        finish = "length" if len(ids) > limit else "stop"
        return TokenOutput(ids[:limit], [-0.25] * min(len(ids), limit), finish)


def call(expression: str, name: str = "flaky_tool") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


@pytest.fixture
def runner(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(f"tools:\n  - class_name: {TOOLS_MODULE}.flaky_tool\n")
    config = load_config([
        "actor_rollout_ref.rollout.multi_turn.enable=true", f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent", f"data.max_response_length={W}",
        "data.return_raw_chat=true",
        "data.max_prompt_length=32", "actor_rollout_ref.rollout.multi_turn.tool_timeout_s=0.5",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=64",
        "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=left",
    ])
    return AgentLoopRunner(agent_config_view(config), TOK)


def prompts(n_rows: int = 1) -> DataProto:
    messages = [{"role": "user", "content": "calc 1+2"}]
    ids = TOK.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    tensor = torch.tensor([ids] * n_rows)
    return DataProto.from_dict(
        tensors={"input_ids": tensor, "attention_mask": torch.ones_like(tensor),
                 "position_ids": torch.arange(tensor.shape[1]).expand_as(tensor)},
        non_tensors={"raw_prompt": np.array([messages] * n_rows + [None], dtype=object)[:-1]})


def run(runner, turns, n=1, seed=None):
    generator = Scripted(turns)
    out = runner.run_sync(prompts(), SamplingConfig(n=n, max_tokens=W, seed=seed), generator, TOK.pad_token_id)
    return out, generator


def response_text(out, row=0):
    length = int(out.batch["attention_mask"][row, -W:].sum())
    return TOK.decode(out.batch["responses"][row, :length].tolist(), skip_special_tokens=False)


def test_call_reply_answer_masks_and_next_prompt(runner):
    out, generator = run(runner, [call("42"), "answer: 42"])
    text = response_text(out)
    assert text == call("42") + "<eos><|user|><tool_response>42</tool_response><eos><|assistant|>answer: 42<eos>"
    reasons = out.batch["loss_mask_reason"][0]
    tool_positions = (reasons == int(LossMaskReason.TOOL)).nonzero().flatten().tolist()
    assert TOK.decode(out.batch["responses"][0, tool_positions].tolist()) == "42"
    # the second turn's prompt is exactly the first prompt + the sampled turn + the inserted ids (no re-tokenising)
    first_prompt, second_prompt = generator.seen[0][0], generator.seen[1][0]
    length = len(second_prompt) - len(first_prompt)
    assert second_prompt[:len(first_prompt)] == first_prompt
    assert second_prompt[len(first_prompt):] == out.batch["responses"][0, :length].tolist()
    metrics = out.meta_info["metrics"]
    assert metrics["agent/tool_calls"] == 1 and metrics["agent/num_turns/mean"] == 4  # user, call, tool, answer


def test_turns_share_the_response_budget(runner):
    _, generator = run(runner, [call("7"), "answer: 7"])
    first, second = generator.seen
    used = len(second[0]) - len(first[0])
    assert first[1]["max_tokens"] == W and second[1]["max_tokens"] == W - used


def test_each_turn_and_sample_gets_its_own_seed(runner):
    _, generator = run(runner, [call("7"), "answer: 7"], n=2, seed=100)
    seeds = sorted(params["seed"] for _, params in generator.seen)
    assert len(set(seeds)) == 4 and seeds[0] == 100  # sample j of prompt 0: seed + j, then + turn stride


def test_raising_tool_is_an_infrastructure_failure(runner):
    out, _ = run(runner, [call("boom"), "answer: 1"])
    assert out.batch["response_mask"].sum() == 0
    assert (out.batch["loss_mask_reason"][0, :5] == int(LossMaskReason.INFRA_FAILURE)).all()
    assert out.meta_info["metrics"]["agent/infra_failures"] == 1


def test_hanging_tool_times_out_as_infrastructure_failure(runner):
    start = time.perf_counter()
    out, _ = run(runner, [call("hang"), "answer: 1"])
    assert time.perf_counter() - start < 4  # tool_timeout_s=0.5, not the tool's 5 s
    assert out.meta_info["metrics"]["agent/infra_failures"] == 1


def test_malformed_and_unknown_calls_get_error_replies_and_are_counted(runner):
    out, _ = run(runner, ['<tool_call>{"name": oops}</tool_call>', call("1", name="nope"), "answer: 1"])
    text = response_text(out)
    # (the tiny tokenizer's alphabet has no capitals or quotes: the replies read "not valid  (...)", "tool nope")
    assert "error: malformed tool call: not valid" in text and "error: unknown tool nope" in text
    metrics = out.meta_info["metrics"]
    assert metrics["agent/malformed_calls"] == 1 and metrics["agent/tool_errors"] == 1
    assert metrics["agent/infra_failures"] == 0 and out.batch["response_mask"].sum() > 0


def test_over_long_reply_is_cut_on_the_configured_side(runner):
    out, _ = run(runner, [call("long"), "answer: 1"])
    assert "<tool_response>" + "x" * 64 + "...</tool_response>" in response_text(out)
    assert truncate_reply("abcdefgh", 4, "right") == "...efgh"
    assert truncate_reply("abcdefgh", 4, "middle") == "ab...gh"


def test_budget_exhaustion_truncates(runner):
    out, _ = run(runner, [call("1") * 3])  # every turn calls again until the budget runs out
    assert out.meta_info["metrics"]["agent/truncated_fraction"] == 1.0
    assert int(out.batch["attention_mask"][0, -W:].sum()) == W


class Updating(Scripted):
    """Scripted, with a weight update (version += 1) landing while each sample's second turn generates, once every
    sample's first turn has ended (the tool calls between them take their own time); with `labels` the engine
    labels its tokens as vLLM 0.32's servers do (the first 2 tokens old, the rest new)."""

    def __init__(self, turns, labels: bool, samples: int = 2) -> None:
        super().__init__(turns)
        self.labels = labels
        self.version = 3
        self.samples = samples
        self.first_turns_ended = 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None):
        second = TOK.convert_ids_to_tokens(list(prompt_ids)).count("<|assistant|>") == 2
        while second and self.first_turns_ended < self.samples:
            await asyncio.sleep(0.001)
        out = await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        if not second:
            self.first_turns_ended += 1
            return out
        old = self.version
        self.version = old + 1
        if self.labels:  # a label the version counter never reached: only the engine's labels can give it
            n = len(out.token_ids)
            out.weight_versions = [(str(old), 0, 2), ("7", 2, n)]
        return out


@pytest.mark.parametrize("labels", [False, True])
def test_a_turn_a_weight_update_froze_keeps_the_finishing_version(runner, labels):
    generator = Updating([call("7"), "answer: 7"], labels)
    out = runner.run_sync(prompts(), SamplingConfig(n=2, max_tokens=W), generator, TOK.pad_token_id)
    versions = out.non_tensor_batch["agent_turn_versions"].tolist()
    # one sample's answer finished after the first update, the other's after the second (the counter moves per
    # turn; which sample's second turn the scheduler runs first is not fixed)
    assert sorted(versions) == ([[3, 7], [3, 7]] if labels else [[3, 4], [3, 5]])
    metrics = out.meta_info["metrics"]
    assert metrics["agent/turns_across_update"] == 2 and metrics["agent/mixed_version_samples"] == 1.0
    assert out.batch["response_mask"].sum() > 0  # the frozen turn is trained (rollout IS reads its log-probs)


@pytest.mark.parametrize(("spans", "before", "after", "expected"), [
    (None, 2, 2, (2, False)),
    (None, 2, 3, (3, True)),
    ([("5", 0, 9)], 5, 6, (5, False)),  # sampled by 5 whole; the counter moved after it finished
    ([("5", 0, 4), ("6", 4, 9)], 5, 6, (6, True)),
    ([("6", 3, 9)], 5, 6, (6, True)),  # tokens before the first label: the engine had none yet
    ([("v1", 0, 9)], 0, 0, (0, False)),  # a label that is not a number: the counter's version
])
def test_turn_version_reads_the_engine_labels_first(spans, before, after, expected):
    from verl_like.experimental.agent_loop.runner import turn_version

    assert turn_version(spans, before, after) == expected
