"""`calculator`: exact arithmetic on integers and decimals, the tool of the embedded `synthetic:calc` task and of
the GSM8K calculator preset. Results are exact: an integer, a terminating decimal ("2.5"), else a fraction ("1/3")."""

from __future__ import annotations

import ast
from fractions import Fraction

from verl_like.tools.function_tool import ToolInputError, function_tool

_MAX_DIGITS = 60  # a result longer than this is refused (no exponent tower can stall the tool)
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise ToolInputError("division by zero")
            result = left / right
        elif type(node.op) in _OPS:
            result = _OPS[type(node.op)](left, right)
        else:
            raise ToolInputError(f"operator {type(node.op).__name__} is not supported; use + - * /")
        if len(str(result.numerator)) > _MAX_DIGITS:
            raise ToolInputError("the result is too large")
        return result
    raise ToolInputError("only numbers, + - * / and parentheses are allowed")


def _format(value: Fraction) -> str:
    """An integer, the exact decimal when the denominator divides a power of ten, else numerator/denominator."""
    if value.denominator == 1:
        return str(value.numerator)
    denominator, places = value.denominator, 0
    while denominator % 2 == 0 or denominator % 5 == 0:
        for factor in (10, 5, 2):
            if denominator % factor == 0:
                denominator //= factor
                break
        places += 1
    if denominator != 1:
        return f"{value.numerator}/{value.denominator}"
    scaled = abs(value) * 10 ** places  # an integer now
    digits = str(int(scaled)).rjust(places + 1, "0")
    text = f"{digits[:-places]}.{digits[-places:]}".rstrip("0").rstrip(".")
    return f"-{text}" if value < 0 else text


@function_tool
def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression exactly.

    Args:
        expression: numbers with + - * / and parentheses, e.g. "347*29" or "(12.5+3)/2".
    """
    try:
        tree = ast.parse(str(expression).strip(), mode="eval")
    except SyntaxError as err:
        raise ToolInputError(f"cannot parse {expression!r}") from err
    return _format(_eval(tree))
