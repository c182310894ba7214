"""The band-math language: a safe parser, the inputs an expression reads, its live-array count, and its evaluation.

An expression such as ``(nir - red) / (nir + red)`` is parsed with :func:`ast.parse` and checked node by node against
a whitelist; it is evaluated by walking that tree, never by ``eval``, ``exec`` or compiled code. Only NumPy is
imported here: xarray and Dask are imported inside :meth:`Expression.evaluate`, and only when the inputs are of
their types, so ``rasterflow validate`` starts fast.
"""

from __future__ import annotations

import ast
import difflib
import math
import operator
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rasterflow.errors import ExpressionError

__all__ = ["ALLOWED_FUNCTIONS", "MAX_EXPRESSION_LENGTH", "MAX_NESTING_DEPTH", "Expression", "parse_expression"]

MAX_EXPRESSION_LENGTH = 2000
MAX_NESTING_DEPTH = 50
_MAX_LITERAL_EXPONENT = 64  # bounds both `**` exponents and shift amounts
_MAX_INT_LITERAL = 2**63

_ARITY = {"where": 3, "clip": 3, "minimum": 2, "maximum": 2, "sqrt": 1, "log": 1, "exp": 1, "abs": 1, "isnan": 1}
ALLOWED_FUNCTIONS: frozenset[str] = frozenset(_ARITY)
_UFUNCS: dict[str, Callable[..., Any]] = {"sqrt": np.sqrt, "log": np.log, "exp": np.exp, "abs": np.abs, "clip": np.clip,
           "minimum": np.minimum, "maximum": np.maximum, "isnan": np.isnan}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.Pow: operator.pow, ast.Mod: operator.mod, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
           ast.BitAnd: operator.and_, ast.BitOr: operator.or_}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}
_UNARY = (ast.USub, ast.UAdd, ast.Invert, ast.Not)
_FORBIDDEN_OPERATORS = {ast.FloorDiv: "//", ast.MatMult: "@", ast.BitXor: "^", ast.Is: "is", ast.IsNot: "is not"}
_FORBIDDEN_NODES = {
    ast.Attribute: "attribute access ('.')", ast.Subscript: "indexing ('[...]')", ast.Slice: "a slice",
    ast.Lambda: "a lambda", ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator expression", ast.NamedExpr: "assignment (':=')",
    ast.JoinedStr: "an f-string", ast.FormattedValue: "an f-string", ast.Starred: "unpacking ('*')",
    ast.Dict: "a dict", ast.Set: "a set", ast.List: "a list", ast.Tuple: "a tuple outside 'x in (...)'",
    ast.IfExp: "'a if b else c' (write where(b, a, c))", ast.Yield: "yield", ast.YieldFrom: "yield",
    ast.Await: "await",
}
_ALLOWED = (
    "allowed: numbers, input names, + - * / ** %, unary - + ~, comparisons < <= > >= == !=, & | << >>, "
    "and/or/not, x in (1, 2, ...), and the functions " + ", ".join(sorted(ALLOWED_FUNCTIONS))
)
_UNPRINTABLE = {"\t": " ", "\n": " ", "\r": " "}  # shown one for one, so the caret's offset stays valid
_NEWLINE = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Expression:
    """A parsed, checked band-math expression.

    ``live_arrays`` is the peak number of array-sized values alive at once while :meth:`evaluate` runs on NumPy
    arrays (one chunk), inputs included. The rule, which the count follows because it is measured by running the
    evaluator itself on stand-in values:

    - every input read is alive for the whole evaluation (the caller holds it); literals and constant
      sub-expressions are scalars and count 0; ``+x`` is ``x`` itself;
    - operands are evaluated left to right; each result stays alive until its parent has been computed, so while a
      node is computed its operands and its own result are alive together;
    - ``x in (a, b, c)`` is ``((x == a) | (x == b)) | (x == c)`` with ``x`` evaluated once (``not in``: ``!=`` and
      ``&``); ``a < b < c`` is ``(a < b) & (b < c)`` with ``b`` evaluated once; ``p and q and r`` is
      ``(p and q) and r``.

    For ``(nir - red) / (nir + red)``: nir, red, ``nir - red``, ``nir + red`` and the quotient: 5.
    """

    text: str
    """The expression as written."""
    names: frozenset[str]
    """The inputs (asset aliases, earlier bands) it reads."""
    live_arrays: int
    """Peak number of array-sized values alive at once during evaluation, inputs included."""
    is_boolean: bool
    """True when the result is certainly boolean (a comparison, ``in``, ``isnan``, ``not``, ``&``/``|`` of those)."""
    _tree: ast.Expression = field(compare=False, repr=False)

    def evaluate(self, env: Mapping[str, Any], out: np.ndarray | None = None) -> Any:
        """Evaluate on NumPy arrays, Dask arrays or xarray objects; lazy inputs give a lazy result.

        With ``out``, on NumPy arrays, an outermost ``+ - * /`` writes into ``out`` when its result has ``out``'s
        dtype and shape (then ``out`` is returned; else the result, as without ``out``): the same values, without a
        new array and a copy. Intermediate results stay new arrays, so :attr:`live_arrays` holds as analysed.

        Parameters
        ----------
        env : Mapping[str, Any]
            Values for at least every name in :attr:`names`.
        out : numpy.ndarray, optional
            Where the result may be written (a slice of the caller's output, say), saving a copy.

        Raises
        ------
        ExpressionError
            If an input is missing or an operation does not apply to the values' types (``~`` on floats, say).
        """
        missing = sorted(self.names.difference(env.keys()))
        if missing:
            source = _Source(self.text, "expression")
            first = next(n for n in ast.walk(self._tree) if isinstance(n, ast.Name) and n.id == missing[0])
            raise source.error(f"no value given for {', '.join(missing)}", source.start(first),
                               f"given: {', '.join(sorted(map(str, env))) or 'nothing'}")
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return _Evaluator(_ARRAY_OPS, env, self.text, out=out).walk(self._tree.body)

    @property
    def is_bit_test(self) -> bool:
        """True when the outermost operation is a bit operation (``&``, ``|``, ``<<``, ``>>``, ``~``), as in
        ``(qa >> 3) & 1``: on integers its nonzero results mean true."""
        body = self._tree.body
        if isinstance(body, ast.BinOp):
            return isinstance(body.op, (ast.BitAnd, ast.BitOr, ast.LShift, ast.RShift))
        return isinstance(body, ast.UnaryOp) and isinstance(body.op, ast.Invert)

    def check_kinds(self, kinds: Mapping[str, str]) -> str:
        """Check the operations against the kinds of the inputs, before any pixel is read.

        Parameters
        ----------
        kinds : Mapping[str, str]
            ``"bool"``, ``"int"`` or ``"float"`` for each input name (an integer asset read raw, a float band...).

        Returns
        -------
        str
            The kind of the result.

        Raises
        ------
        ExpressionError
            With a caret under the operation, when an integer-only operation (``<<``, ``>>``, ``&``, ``|``, ``~``)
            gets a float input, e.g. a bit test on a band that is loaded as floats.
        """
        missing = sorted(self.names.difference(kinds))
        if missing:
            raise ExpressionError(f"no kind given for {', '.join(missing)}", self.text)
        kind: str = _Evaluator(_KindOps(), {name: _Kind(kinds[name]) for name in self.names}, self.text).walk(
            self._tree.body
        ).kind
        return kind


def parse_expression(text: str, known_names: Iterable[str], *, what: str = "expression") -> Expression:
    """Parse and check a band-math expression; nothing in it is computed.

    Parameters
    ----------
    text : str
        The expression, e.g. ``"(nir - red) / (nir + red)"``.
    known_names : iterable of str
        The names it may read (asset aliases and earlier bands).
    what : str
        What the expression is, for messages: ``"mask"``, ``"band 'ndvi'"``.

    Raises
    ------
    ExpressionError
        If the text is not an allowed expression, names something unknown, or exceeds a size limit. The message
        shows the expression with a caret under the offending token and says what is allowed.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"invalid {what}: expected text, got {type(text).__name__}", hint=_ALLOWED)
    source = _Source(text, what)
    _check_text(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarnings about code we reject anyway
            tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise source.error(f"syntax error ({exc.msg})", source.syntax_error_offset(exc)) from None
    except (RecursionError, MemoryError, ValueError):
        raise source.error("the expression is too complex to parse", 0) from None
    _check_depth(source, tree)
    checker = _Checker(source, frozenset(known_names))
    checker.check(tree.body)
    if not checker.names:
        raise source.error("it reads no input", 0, _known_names_hint(checker.known, None))
    live_arrays, is_boolean = _analyse(tree, checker.names)
    return Expression(text, frozenset(checker.names), live_arrays, is_boolean, tree)


# --- positions and messages ------------------------------------------------------------------------------------------


class _Source:
    """The expression text, with the position arithmetic ``ast`` needs (its columns are UTF-8 byte offsets)."""

    def __init__(self, text: str, what: str):
        self.text = text
        self.what = what
        short = len(text) <= MAX_EXPRESSION_LENGTH  # longer texts are refused before any position is needed
        self._line_starts = [0] + ([m.end() for m in _NEWLINE.finditer(text)] if short else [])

    def offset(self, lineno: int, col_bytes: int) -> int:
        start = self._line_starts[lineno - 1]
        line = self.text[start : self._line_starts[lineno] if lineno < len(self._line_starts) else len(self.text)]
        return start + len(line.encode("utf-8")[:col_bytes].decode("utf-8", "ignore"))

    # Every node these get (expressions, keywords) carries a position; ast.AST itself does not declare one.
    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def find_after(self, node: ast.AST, chars: str) -> int:
        """Offset of the first of ``chars`` after ``node``: the ``.`` of an attribute, the ``[`` of an index."""
        start = self.end(node)
        return next((i for i in range(start, len(self.text)) if self.text[i] in chars), start)

    def operator_between(self, left: ast.AST, right: ast.AST) -> int:
        """Offset of the operator token between two operands (``ast`` records only the operands' positions)."""
        start, stop = self.end(left), self.start(right)
        return next((i for i in range(start, stop) if not self.text[i].isspace() and self.text[i] not in "()"), start)

    def syntax_error_offset(self, exc: SyntaxError) -> int:
        lineno = min(max(exc.lineno or 1, 1), len(self._line_starts))
        line_start = self._line_starts[lineno - 1]
        line_end = self._line_starts[lineno] if lineno < len(self._line_starts) else len(self.text)
        if not exc.offset or exc.offset < 1:  # CPython reports 0 for "unexpected end of input"
            return len(self.text[:line_end].rstrip("\r\n"))
        return min(line_start + exc.offset - 1, len(self.text))

    def error(self, problem: str, offset: int, hint: str = _ALLOWED) -> ExpressionError:
        shown, caret = self.text, offset
        if len(self.text) > MAX_EXPRESSION_LENGTH:  # show the neighbourhood of the caret, not a megabyte
            start, stop = max(0, offset - 60), min(len(self.text), offset + 20)
            prefix, suffix = ("..." if start else ""), ("..." if stop < len(self.text) else "")
            shown, caret = prefix + self.text[start:stop] + suffix, offset - start + len(prefix)
        shown = "".join(char if char.isprintable() else _UNPRINTABLE.get(char, "\ufffd") for char in shown)
        return ExpressionError(f"invalid {self.what}: {problem}", shown, caret, hint)


def _known_names_hint(known: frozenset[str], name: str | None) -> str:
    hint = f"known names: {', '.join(sorted(known))}" if known else "no input names are defined"
    close = difflib.get_close_matches(name, sorted(known), n=1) if name else []
    return hint + (f"; did you mean '{close[0]}'?" if close else "")


def _signed_literal(node: ast.AST) -> int | float | None:
    """The value of ``3``, ``-0.5`` or ``+2``; None for anything else (booleans included)."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        sign, node = (-1 if isinstance(node.op, ast.USub) else 1), node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return sign * node.value
    return None


# --- checking --------------------------------------------------------------------------------------------------------


def _check_text(source: _Source) -> None:
    """Limits checked on the raw text, before ``ast.parse`` can spend time or recursion on it."""
    text = source.text
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise source.error(f"it is {len(text)} characters long; the limit is {MAX_EXPRESSION_LENGTH}",
                           MAX_EXPRESSION_LENGTH)
    if not text.strip():
        raise source.error("it is empty", 0)
    depth = 0
    for offset, char in enumerate(text):
        if not char.isprintable() and char not in " \t\r\n":
            raise source.error(f"unexpected character U+{ord(char):04X}", offset)
        depth += (char in "([{") - (char in ")]}")
        if depth > MAX_NESTING_DEPTH:
            raise source.error(f"brackets nest more than {MAX_NESTING_DEPTH} deep", offset)


def _check_depth(source: _Source, tree: ast.Expression) -> None:
    """Bound the tree depth without recursing, so that the recursive checker and evaluator are safe."""
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING_DEPTH:
            raise source.error(f"it nests more than {MAX_NESTING_DEPTH} operations deep", source.start(node))
        stack.extend((child, depth + isinstance(child, ast.expr)) for child in ast.iter_child_nodes(node))


class _Checker:
    """Walks the tree against the whitelist and collects the input names; ``check`` says whether a node reads one."""

    def __init__(self, source: _Source, known: frozenset[str]):
        self.source = source
        self.known = known
        self.names: set[str] = set()

    def fail(self, problem: str, offset: int, hint: str = _ALLOWED) -> ExpressionError:
        return self.source.error(problem, offset, hint)

    def check(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return self._constant(node)
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.BinOp):
            return self._binary(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY):
            return self.check(node.operand)
        if isinstance(node, ast.BoolOp):
            return any([self.check(value) for value in node.values])
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        offset = self.source.start(node)
        if isinstance(node, ast.Attribute):
            offset = self.source.find_after(node.value, ".")
        elif isinstance(node, ast.Subscript):
            offset = self.source.find_after(node.value, "[")
        raise self.fail(f"{_FORBIDDEN_NODES.get(type(node), type(node).__name__)} is not allowed", offset)

    def _constant(self, node: ast.Constant) -> bool:
        value, offset = node.value, self.source.start(node)
        if type(value) is bool:
            raise self.fail(f"{value} is not allowed; write a comparison such as scl == 3", offset)
        if type(value) not in (int, float):
            kind = {str: "text", bytes: "bytes", complex: "a complex number"}.get(type(value), repr(value))
            raise self.fail(f"{kind} is not allowed", offset)
        if type(value) is int and abs(value) > _MAX_INT_LITERAL:
            raise self.fail("the integer is too large (the limit is 2**63)", offset)
        if not math.isfinite(float(value)):  # type: ignore[arg-type]  # int or float, checked above
            raise self.fail("the number is out of range", offset)
        return False

    def _name(self, node: ast.Name) -> bool:
        offset = self.source.start(node)
        if node.id.startswith("__"):
            raise self.fail(f"names starting with '__' are not allowed: '{node.id}'", offset)
        if node.id in self.known:
            self.names.add(node.id)
            return True
        if node.id in ALLOWED_FUNCTIONS:
            raise self.fail(f"'{node.id}' is a function; call it, e.g. {node.id}(x)", offset)
        raise self.fail(f"unknown name '{node.id}'", offset, _known_names_hint(self.known, node.id))

    def _binary(self, node: ast.BinOp) -> bool:
        op_offset = self.source.operator_between(node.left, node.right)
        if type(node.op) not in _BINARY:
            symbol = _FORBIDDEN_OPERATORS.get(type(node.op), type(node.op).__name__)
            raise self.fail(f"the operator '{symbol}' is not allowed", op_offset)
        left_reads, right_reads = self.check(node.left), self.check(node.right)
        if isinstance(node.op, (ast.Pow, ast.LShift, ast.RShift)):
            self._check_exponent(node, left_reads, right_reads)
        return left_reads or right_reads

    def _check_exponent(self, node: ast.BinOp, left_reads: bool, right_reads: bool) -> None:
        # Constants are Python ints at evaluation, of unbounded size: 2 ** 10 ** 10 would never finish.
        word = "exponent" if isinstance(node.op, ast.Pow) else "shift"
        amount = _signed_literal(node.right)
        if amount is not None and abs(amount) > _MAX_LITERAL_EXPONENT:
            raise self.fail(f"the {word} {amount} is too large (at most {_MAX_LITERAL_EXPONENT})",
                            self.source.start(node.right))
        if amount is None and not right_reads:
            raise self.fail(f"the {word} must be a number such as 2 or 0.5, or read an input",
                            self.source.start(node.right))
        # A shift adds at most 64 bits, but a power multiplies: ((2 ** 64) ** 64) ** 64 ... must not start.
        if isinstance(node.op, ast.Pow) and not (left_reads or right_reads) and _signed_literal(node.left) is None:
            raise self.fail("a constant power needs a plain number as its base", self.source.start(node.left))

    def _compare(self, node: ast.Compare) -> bool:
        reads = self.check(node.left)
        operands = [node.left, *node.comparators]
        for index, (op, right) in enumerate(zip(node.ops, node.comparators)):
            if type(op) in _FORBIDDEN_OPERATORS:
                symbol = _FORBIDDEN_OPERATORS[type(op)]
                hint = "use == or != to compare values; " + _ALLOWED
                offset = self.source.operator_between(operands[index], right)
                raise self.fail(f"the operator '{symbol}' is not allowed", offset, hint)
            if not isinstance(op, (ast.In, ast.NotIn)):
                reads = self.check(right) or reads
                continue
            if not (isinstance(right, ast.Tuple) and right.elts):
                offset = self.source.start(right)
                raise self.fail("'in' needs a tuple of numbers on its right, e.g. scl in (3, 8, 9)", offset)
            for element in right.elts:
                if _signed_literal(element) is None:
                    raise self.fail("the values after 'in' must be numbers", self.source.start(element))
                self.check(element)  # range checks on the literal
            if index < len(node.ops) - 1:
                raise self.fail("'in (...)' must end a comparison; add parentheses",
                                self.source.operator_between(right, node.comparators[index + 1]))
        return reads

    def _call(self, node: ast.Call) -> bool:
        func = node.func
        if not isinstance(func, ast.Name):
            self.check(func)  # says "attribute access is not allowed" for nir.clip(0, 1), and so on
            raise self.fail("only these functions can be called: " + ", ".join(sorted(ALLOWED_FUNCTIONS)),
                            self.source.start(func))
        offset = self.source.start(func)
        if func.id.startswith("__"):
            raise self.fail(f"names starting with '__' are not allowed: '{func.id}'", offset)
        if func.id not in ALLOWED_FUNCTIONS:
            close = difflib.get_close_matches(func.id, sorted(ALLOWED_FUNCTIONS), n=1)
            known = func.id in self.known
            problem = f"'{func.id}' is an input, not a function" if known else f"unknown function '{func.id}'"
            hint = "functions: " + ", ".join(sorted(ALLOWED_FUNCTIONS))
            hint += f"; did you mean '{close[0]}'?" if close else ""
            raise self.fail(problem, offset, hint)
        if node.keywords:
            raise self.fail("keyword arguments are not allowed", self.source.start(node.keywords[0]))
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise self.fail("unpacking ('*') is not allowed", self.source.start(arg))
        if len(node.args) != _ARITY[func.id]:
            count = _ARITY[func.id]
            raise self.fail(f"{func.id}() takes {count} argument{'s' * (count > 1)}, got {len(node.args)}", offset)
        return any([self.check(arg) for arg in node.args])


# --- evaluation ------------------------------------------------------------------------------------------------------


class _Evaluator:
    """Walks a checked tree. The operations come from ``ops``: real arrays, or the stand-ins that count liveness."""

    def __init__(self, ops: Any, env: Mapping[str, Any], text: str, out: np.ndarray | None = None):
        self._ops = ops
        self._env = env
        self._text = text
        self._out = out if ops is _ARRAY_OPS else None  # the analyses' stand-ins never write

    def walk(self, node: ast.AST, root: bool = True) -> Any:
        ops = self._ops
        if isinstance(node, ast.Constant):
            return ops.literal(node.value)
        if isinstance(node, ast.Name):
            return self._env[node.id]
        if isinstance(node, ast.BinOp):
            left, right = self.walk(node.left, False), self.walk(node.right, False)
            if root and self._out is not None and _fits(self._out, type(node.op), left, right):
                return self._apply(node, _into, type(node.op), left, right, self._out)
            return self._apply(node, ops.binary, type(node.op), left, right)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.UAdd):
                return self.walk(node.operand, False)
            return self._apply(node, ops.unary, type(node.op), self.walk(node.operand, False))
        if isinstance(node, ast.BoolOp):
            result = self.walk(node.values[0], False)
            for value in node.values[1:]:
                result = self._apply(node, ops.logical, type(node.op), result, self.walk(value, False))
            return result
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.Call):
            args = [self.walk(arg, False) for arg in node.args]
            assert isinstance(node.func, ast.Name)  # the checker allows only named functions
            return self._apply(node, ops.call, node.func.id, *args)
        raise AssertionError(f"unchecked node {type(node).__name__}")  # the checker lets nothing else through

    def _compare(self, node: ast.Compare) -> Any:
        ops, left, combined = self._ops, self.walk(node.left, False), None
        for op, comparator in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)):
                right, step = None, self._membership(node, op, left, comparator)
            else:
                right = self.walk(comparator, False)
                step = self._apply(node, ops.compare, type(op), left, right)
            left = right  # the previous operand is no longer needed
            combined = step if combined is None else self._apply(node, ops.logical, ast.And, combined, step)
            del step
        return combined

    def _membership(self, node: ast.Compare, op: ast.cmpop, value: Any, choices: ast.expr) -> Any:
        # An OR-chain of == rather than np.isin, which neither Dask nor xarray dispatch lazily.
        test, join = (ast.Eq, ast.Or) if isinstance(op, ast.In) else (ast.NotEq, ast.And)
        assert isinstance(choices, ast.Tuple)  # the checker allows only tuple literals after `in`
        literals = [_signed_literal(element) for element in choices.elts]
        hits = self._apply(node, self._ops.compare, test, value, literals[0])
        for literal in literals[1:]:
            step = self._apply(node, self._ops.compare, test, value, literal)
            hits = self._apply(node, self._ops.logical, join, hits, step)
            del step  # so that it is freed with the old `hits`, as in ((x == a) | (x == b)) | (x == c)
        return hits

    def _apply(self, node: ast.AST, operation: Any, *args: Any) -> Any:
        try:
            return operation(*args)
        except ExpressionError:
            raise
        except (ArithmeticError, TypeError, ValueError) as exc:
            source = _Source(self._text, "expression")
            offset = source.start(node)
            if isinstance(node, ast.BinOp):
                offset = source.operator_between(node.left, node.right)
            raise source.error(f"cannot evaluate: {exc}", offset, "check the types and values of the inputs") from exc


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float))  # Python numbers only: NumPy scalars would promote float32 (NEP 50)


def _python_scalar(result: Any, *operands: Any) -> Any:
    """NumPy turns Python scalars into NumPy ones; turn them back so constants stay weakly typed."""
    if all(_is_scalar(operand) for operand in operands) and np.ndim(result) == 0:
        return result.item() if hasattr(result, "item") else result
    return result


def _module_of(value: Any) -> str:
    return type(value).__module__.partition(".")[0]


class _ArrayOps:
    """The real operations: operators and NumPy ufuncs, which Dask and xarray dispatch lazily."""

    @staticmethod
    def literal(value: int | float) -> int | float:
        return value

    @staticmethod
    def binary(op: type[ast.operator], left: Any, right: Any) -> Any:
        result = _BINARY[op](left, right)
        return math.nan if isinstance(result, complex) else result  # (-8) ** 0.5: NaN, as NumPy gives

    @staticmethod
    def unary(op: type, operand: Any) -> Any:
        if op is ast.Not or (op is ast.Invert and isinstance(operand, bool)):  # Python's ~True is -2
            return _python_scalar(np.logical_not(operand), operand)
        return operator.neg(operand) if op is ast.USub else operator.invert(operand)

    @staticmethod
    def compare(op: type[ast.cmpop], left: Any, right: Any) -> Any:
        return _COMPARE[op](left, right)

    @staticmethod
    def logical(op: type, left: Any, right: Any) -> Any:
        ufunc = np.logical_and if op is ast.And else np.logical_or
        return _python_scalar(ufunc(left, right), left, right)

    @staticmethod
    def call(name: str, *args: Any) -> Any:
        modules = {_module_of(arg) for arg in args}
        if name in ("where", "clip") and "xarray" in modules:  # np.where and np.clip would load the data
            import xarray

            if name == "where":
                return xarray.where(*args)  # type: ignore[no-untyped-call]  # xarray.where has no annotations
            return xarray.apply_ufunc(np.clip, *args, dask="allowed", keep_attrs=True)
        if name == "where" and "dask" in modules:
            import dask.array

            return dask.array.where(*args)
        function = np.where if name == "where" else _UFUNCS[name]
        return _python_scalar(function(*args), *args)


_ARRAY_OPS = _ArrayOps()

_INTO_UFUNCS: dict[type[ast.operator], Any] = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply,
                                                   ast.Div: np.true_divide}


def _fits(into: np.ndarray, op: type[ast.operator], left: Any, right: Any) -> bool:
    """Whether ``left op right`` on NumPy arrays and Python numbers can be written into ``into``: the same dtype
    (NumPy's promotion, Python numbers weak) and shape as the result would have, so the values are those of
    ``left op right``."""
    if op not in _INTO_UFUNCS:
        return False
    operands = (left, right)
    if not all(type(v) is np.ndarray or _is_scalar(v) for v in operands) or all(_is_scalar(v) for v in operands):
        return False
    try:
        shape = np.broadcast_shapes(*(np.shape(v) for v in operands))
        return bool(np.result_type(left, right) == into.dtype and shape == into.shape)
    except (TypeError, ValueError, OverflowError):  # the operation itself then says what is wrong, located
        return False


def _into(op: type[ast.operator], left: Any, right: Any, into: np.ndarray) -> np.ndarray:
    return _INTO_UFUNCS[op](left, right, out=into)  # type: ignore[no-any-return]


class _LiveCount:
    def __init__(self) -> None:
        self.alive = 0
        self.peak = 0


class _StandIn:
    """A value in the liveness analysis. An array-sized one (``count`` set) is alive from its creation until CPython
    frees it, which is exactly when the real array is freed, because the evaluator's code is the same."""

    __slots__ = ("count", "boolean")

    def __init__(self, count: _LiveCount | None, boolean: bool):
        self.count, self.boolean = count, boolean
        if count is not None:
            count.alive += 1
            count.peak = max(count.peak, count.alive)

    def __del__(self) -> None:
        if self.count is not None:
            self.count.alive -= 1


class _CountingOps:
    """Stand-in operations: each creates one new array when an operand is an array, and computes nothing."""

    def __init__(self, count: _LiveCount):
        self.count = count

    def _result(self, boolean: bool, *operands: Any) -> _StandIn:
        is_array = any(isinstance(operand, _StandIn) and operand.count is not None for operand in operands)
        return _StandIn(self.count if is_array else None, boolean)

    def literal(self, value: int | float) -> _StandIn:
        return _StandIn(None, False)

    def binary(self, op: type, left: Any, right: Any) -> Any:
        return self._result(op in (ast.BitAnd, ast.BitOr) and left.boolean and right.boolean, left, right)

    def unary(self, op: type, operand: Any) -> Any:
        return self._result(op is ast.Not or (op is ast.Invert and operand.boolean), operand)

    def compare(self, op: type, left: Any, right: Any) -> Any:
        return self._result(True, left, right)

    def logical(self, op: type, left: Any, right: Any) -> Any:
        return self._result(True, left, right)

    def call(self, name: str, *args: Any) -> Any:
        if name == "where":
            boolean = args[1].boolean and args[2].boolean
        else:
            boolean = name == "isnan" or (name in ("abs", "minimum", "maximum") and all(a.boolean for a in args))
        return self._result(boolean, *args)


class _Kind:
    """A value in the kind analysis: ``bool``, ``int`` or ``float``, as NumPy would type the real arrays."""

    __slots__ = ("kind",)
    _ORDER = {"bool": 0, "int": 1, "float": 2}

    def __init__(self, kind: str):
        self.kind = kind

    @classmethod
    def widest(cls, *values: _Kind) -> _Kind:
        return cls(max((v.kind for v in values), key=cls._ORDER.__getitem__))


_INTEGER_ONLY = {ast.LShift: "<<", ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|"}


class _KindOps:
    """Kind propagation: what NumPy would compute, and a TypeError where NumPy would raise one on real pixels."""

    @staticmethod
    def literal(value: int | float) -> _Kind:
        return _Kind("float" if isinstance(value, float) else "bool" if isinstance(value, bool) else "int")

    @staticmethod
    def _integer_only(symbol: str, *operands: _Kind) -> None:
        if any(operand.kind == "float" for operand in operands):
            raise TypeError(
                f"'{symbol}' needs integer (or true/false) inputs, but an input here is float: bit operations work "
                "on the source integers, which only the mask sees (bands see scaled floats); test the bits in the "
                "mask, or compare instead (e.g. (a > 0) & (b > 0))"
            )

    def binary(self, op: type, left: _Kind, right: _Kind) -> _Kind:
        if op in _INTEGER_ONLY:
            self._integer_only(_INTEGER_ONLY[op], left, right)
            if op in (ast.LShift, ast.RShift):
                return _Kind("int")
            return _Kind.widest(left, right)
        if op is ast.Div:
            return _Kind("float")
        widest = _Kind.widest(left, right)
        return _Kind("int") if widest.kind == "bool" else widest

    def unary(self, op: type, operand: _Kind) -> _Kind:
        if op is ast.Not:
            return _Kind("bool")
        if op is ast.Invert:
            self._integer_only("~", operand)
            return operand
        return _Kind("int") if operand.kind == "bool" else operand

    @staticmethod
    def compare(op: type, left: _Kind, right: _Kind) -> _Kind:
        return _Kind("bool")

    @staticmethod
    def logical(op: type, left: _Kind, right: _Kind) -> _Kind:
        return _Kind("bool")

    @staticmethod
    def call(name: str, *args: _Kind) -> _Kind:
        if name == "isnan":
            return _Kind("bool")
        if name in ("sqrt", "log", "exp"):
            return _Kind("float")
        if name == "where":
            return _Kind.widest(args[1], args[2])
        return _Kind.widest(*args)


def _analyse(tree: ast.Expression, names: Iterable[str]) -> tuple[int, bool]:
    """Run the evaluator on stand-ins: the peak of live arrays, and whether the result is boolean."""
    count = _LiveCount()
    env = {name: _StandIn(count, False) for name in names}  # held by the caller for the whole evaluation
    result = _Evaluator(_CountingOps(count), env, "").walk(tree.body)
    return count.peak, bool(result.boolean)
