"""The start-up check of the chat template (chat_turns.check_template), on the tiny tool tokenizer with three
templates: its own (extends its prefix), one that drops the reasoning of every assistant turn but the last (the
history-rewriting kind: refused, naming the template and the first differing token), and one that drops reasoning
only before the last user query, as Qwen3's does (tool replies are not queries: it extends its prefix in tool
loops and passes)."""

import pytest

from verl_like.config.loader import load_config
from verl_like.experimental.agent_loop.chat_turns import TemplateError, check_template
from verl_like.experimental.agent_loop.engine_rollout import check_chat_template
from verl_like.experimental.agent_loop.runner import agent_config_view
from verl_like.models.tiny import TOOLS_CHAT_TEMPLATE, build_tokenizer

_TURN = ("{% if message['role'] == 'tool' %}"
         "{{ '<|user|><tool_response>' + message['content'] + '</tool_response>' + eos_token }}"
         "{% else %}{{ '<|' + message['role'] + '|>' + content + eos_token }}{% endif %}")
_HEAD = "{{ bos_token }}"
_TAIL = "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
# Every assistant turn before the last loses its reasoning.
DROPS_EARLIER_REASONING = (
    _HEAD + "{% set last = namespace(i=-1) %}{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{% set last.i = loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and loop.index0 < last.i and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}" + _TURN + "{% endfor %}" + _TAIL)
# Reasoning is dropped only from assistant turns before the last user message that is not a tool reply.
DROPS_REASONING_BEFORE_LAST_QUERY = (
    _HEAD + "{% set q = namespace(i=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set q.i = loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and loop.index0 < q.i and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}{% endif %}" + _TURN + "{% endfor %}" + _TAIL)


def tokenizer(template: str):
    tok = build_tokenizer("tools")
    tok.add_tokens(["<think>", "</think>", "\n"], special_tokens=True)  # reasoning markers, as reasoning models have
    tok.chat_template = template
    return tok


def test_the_tiny_template_extends_its_prefix():
    assert check_template(tokenizer(TOOLS_CHAT_TEMPLATE), "tiny") is None


def test_a_template_that_drops_earlier_reasoning_is_refused_naming_it():
    problem = check_template(tokenizer(DROPS_EARLIER_REASONING), "the chat template of my-model")
    assert problem is not None
    assert "the chat template of my-model does not extend its own prefix" in problem
    assert "'<think>" in problem  # the first differing token: the reasoning the whole rendering dropped
    assert "tokenization_sanity_check_mode=disable" in problem  # the fix
    assert check_template(tokenizer(DROPS_EARLIER_REASONING), "t", mode="disable") is None


def test_dropping_reasoning_only_before_the_last_user_query_passes_in_tool_loops():
    assert check_template(tokenizer(DROPS_REASONING_BEFORE_LAST_QUERY), "qwen3-like") is None


def test_the_start_up_check_raises_on_it():  # trainer/setup.py calls it before any worker starts
    config = load_config(["actor_rollout_ref.rollout.multi_turn.enable=true",
                          "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent", "data.return_raw_chat=true"])
    with pytest.raises(TemplateError, match="does not extend its own prefix"):
        check_chat_template(tokenizer(DROPS_EARLIER_REASONING), agent_config_view(config))
    check_chat_template(tokenizer(TOOLS_CHAT_TEMPLATE), agent_config_view(config))  # passes
