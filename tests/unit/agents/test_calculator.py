"""The calculator tool: exact results checked against an independent Fraction evaluation, decimals rendered exactly,
bad input refused as the tool's own error (the model reads it; the run goes on)."""

import re
from fractions import Fraction

import pytest

from verl_like.tools.calculator import calculator
from verl_like.tools.function_tool import ToolInputError


def reference(expression: str) -> Fraction:
    """Python's own evaluation with every literal made a Fraction (exact, no float rounding)."""
    return eval(re.sub(r"\d+(\.\d+)?", lambda m: f"Fraction('{m.group(0)}')", expression), {"Fraction": Fraction})


def parse(text: str) -> Fraction:
    """The tool's output back as a Fraction ('7.75', '-1/3', '10063')."""
    return Fraction(text)


@pytest.mark.parametrize("expression, expected", [
    ("347*29", "10063"), ("(12.5+3)/2", "7.75"), ("1/3", "1/3"), ("-7/4", "-1.75"), ("0.1+0.2", "0.3"),
    ("1/40", "0.025"), ("6/3", "2"), ("2*(3-10)", "-14"), ("-1/6", "-1/6"), ("0.5*0.5", "0.25"),
])
def test_exact_values(expression, expected):
    assert calculator(expression) == expected
    assert parse(expected) == reference(expression)


@pytest.mark.parametrize("expression, message", [
    ("2**100", "not supported"), ("1/0", "division by zero"), ("x+1", "only numbers"), ("3 +", "cannot parse"),
    ("9" * 40 + "*" + "9" * 40, "too large"),
])
def test_bad_input_is_the_tools_error(expression, message):
    with pytest.raises(ToolInputError, match=message):
        calculator(expression)


def test_the_agent_loop_sees_the_error_as_text():
    import asyncio

    response, _, info = asyncio.run(calculator.execute("i", {"expression": "1/0"}))
    assert response.text == "error: division by zero" and info == {"error": True}
