"""`calculator`: exact integer and fraction arithmetic, the tool of the embedded `synthetic:calc` task."""

from __future__ import annotations

import ast
from fractions import Fraction

from verl_like.tools.function_tool import ToolInputError, function_tool

_MAX_DIGITS = 60  # a result longer than this is refused (no exponent tower can stall the tool)
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return Fraction(node.value)
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
    raise ToolInputError("only integers, + - * / and parentheses are allowed")


@function_tool
def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression exactly.

    Args:
        expression: integers with + - * / and parentheses, e.g. "347*29".
    """
    try:
        tree = ast.parse(str(expression).strip(), mode="eval")
    except SyntaxError as err:
        raise ToolInputError(f"cannot parse {expression!r}") from err
    value = _eval(tree)
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
