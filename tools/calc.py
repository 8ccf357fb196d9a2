"""`calculate`: arithmetic through the ast module: no eval, no names beyond a few constants."""

from __future__ import annotations

import ast
import math
import operator
from typing import Annotated

_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"sqrt": math.sqrt, "log": math.log, "log10": math.log10, "exp": math.exp, "abs": abs,
          "round": round, "min": min, "max": max, "sin": math.sin, "cos": math.cos, "tan": math.tan}
_CONSTS = {"pi": math.pi, "e": math.e}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise ValueError("exponent too large")
        return _BIN[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
            and not node.keywords and len(node.args) <= 4):
        return _FUNCS[node.func.id](*(_eval(a) for a in node.args))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def calculate(expression: Annotated[str, {"maxLength": 64}]) -> dict:
    """Evaluate an arithmetic expression (+ - * / // % **, parentheses, sqrt, log, exp, min, max, pi).

    Args:
        expression: the expression, e.g. "(12.5 * 3) / 4"
    """
    if len(expression) > 64:
        raise ValueError("expression longer than 64 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an expression: {e.msg}") from None
    value = _eval(tree)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        value = int(value)
    return {"expression": expression, "value": value}
