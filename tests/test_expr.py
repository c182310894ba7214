"""Tests of the band-math language: hostile input, error messages, liveness counts, and evaluation on NumPy, Dask
and xarray."""

from __future__ import annotations

import ast
import builtins
import contextlib
import os
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rasterflow.errors import ExpressionError
from rasterflow.expr import ALLOWED_FUNCTIONS, MAX_EXPRESSION_LENGTH, Expression, parse_expression

KNOWN = ("nir", "red", "scl", "qa")
REPO = Path(__file__).resolve().parents[1]

# --- hostile input ----------------------------------------------------------------------------------------------------

HOSTILE = [
    "__import__('os').system('x')",
    "().__class__.__bases__",
    "nir.__class__",
    "nir.__class__.__mro__[1].__subclasses__()",
    "nir.real",
    "nir.clip(0, 1)",
    "open('/etc/passwd')",
    "getattr(nir, 'x')",
    "eval('1')",
    "exec('import os')",
    "compile('1', '', 'eval')",
    "globals()",
    "lambda: 1",
    "(lambda: 1)()",
    "[x for x in nir]",
    "{x for x in nir}",
    "(x for x in nir)",
    "nir[0]",
    "nir[::2]",
    "(y := nir)",
    'f"{nir}"',
    "'abc'",
    "b'x'",
    "None",
    "True",
    "...",
    "__builtins__",
    "__name__",
    "__import__",
    "nir if red else scl",
    "*nir",
    "sqrt(*nir)",
    "sqrt(**nir)",
    "{1: 2}",
    "{nir}",
    "[1, 2]",
    "(nir, red)",
    "sqrt(x=nir)",
    "clip(nir, lo=0, hi=1)",
    "sqrt(nir, red)",
    "where(nir > 0, nir)",
    "foo(nir)",
    "nir(1)",
    "sqrt",
    "1j",
    "2 ** 10 ** 10",
    "2 ** 1000",
    "10**400",
    "(2 ** 63) ** 64",
    "nir ** 100",
    "1 << 10 ** 10",
    "qa >> 100",
    "100000000000000000000000000000 * nir",
    "1e999 * nir",
    "(" * 5000 + "nir" + ")" * 5000,
    "(" * 60 + "nir" + ")" * 60,
    "-" * 100000 + "nir",
    "-" * 1990 + "nir",
    "not " * 400 + "nir",
    "nir" + " + nir" * 60,
    "nir; import os",
    "yield nir",
    "(yield nir)",
    "await nir",
    "",
    "   ",
    "# just a comment",
    "nir + " * 200_000 + "nir",  # about 1 MB
    "nir @ red",
    "nir // red",
    "nir ^ red",
    "nir is red",
    "nir is not red",
    "nir in red",
    "scl in ()",
    "scl in (3, nir)",
    "scl in (3, 8) == nir",
    "nir\x00",
    "nir +\x0c red",
    "nir + 1 +",
    "1 + 2",
]


@contextlib.contextmanager
def _tripwires():
    """Record any call that would run code: os.system, open, eval, exec, imports, compiling to bytecode."""
    calls: list[tuple[str, object]] = []
    armed = [True]  # disarmed before MonkeyPatch undoes the patches, which may import
    real_import, real_compile = builtins.__import__, builtins.compile

    def recorder(name):
        return lambda *args, **kwargs: calls.append((name, args)) if armed else None

    def recording_import(name, *args, **kwargs):
        if armed:
            calls.append(("import", name))
        return real_import(name, *args, **kwargs)

    def recording_compile(source, filename, mode, flags=0, *args, **kwargs):
        if armed and not flags & ast.PyCF_ONLY_AST:  # ast.parse compiles to a tree only, which is the point
            calls.append(("compile", source))
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "system", recorder("os.system"))
        patch.setattr(os, "popen", recorder("os.popen"))
        patch.setattr(subprocess, "Popen", recorder("Popen"))
        for name in ("open", "eval", "exec"):
            patch.setattr(builtins, name, recorder(name))
        patch.setattr(builtins, "compile", recording_compile)
        patch.setattr(builtins, "__import__", recording_import)  # last: MonkeyPatch.setattr itself imports
        try:
            yield calls
        finally:
            armed.clear()


def test_tripwires_fire():
    with _tripwires() as calls:
        os.system("true")
        open("/nonexistent")
        __import__("json")
        compile("1", "<test>", "eval")
    assert [name for name, _ in calls] == ["os.system", "open", "import", "compile"]


def _as_shown(text: str) -> str:
    """The one-line form an error message shows: newlines and tabs as spaces, other control characters as U+FFFD."""
    return "".join(c if c.isprintable() else (" " if c in "\t\n\r" else "\ufffd") for c in text)


def _reject(text: str, known=KNOWN, **kwargs) -> ExpressionError:
    with pytest.raises(ExpressionError) as info:
        parse_expression(text, known, **kwargs)
    return info.value


def _caret_column(err: ExpressionError) -> int:
    """The column of the caret under the shown expression, and a check that both lines are in the message."""
    lines = str(err).splitlines()
    shown = "    " + err.expression
    assert shown in lines, str(err)
    caret_line = lines[lines.index(shown) + 1]
    assert caret_line.strip() == "^" and caret_line.startswith("    "), str(err)
    return len(caret_line) - 1 - 4


def _short_id(text: str) -> str:
    return repr(text[:40]) + (f"..[{len(text)}]" if len(text) > 40 else "")


@pytest.mark.parametrize("text", HOSTILE, ids=_short_id)
def test_hostile_expression_is_rejected_fast_and_runs_nothing(text):
    error = None
    with _tripwires() as calls:
        started = time.perf_counter()
        try:
            parse_expression(text, KNOWN)
        except ExpressionError as exc:
            error = exc
        elapsed = time.perf_counter() - started
    assert error is not None, f"accepted {text[:80]!r}"
    assert calls == []
    assert elapsed < 0.5
    message = str(error)
    assert any(word in message for word in ("allowed:", "known names:", "functions:"))
    if text == "":  # nothing to point at: the message says so instead of showing an empty line with a caret
        assert "empty" in message
        return
    column = _caret_column(error)
    assert column == error.offset
    if len(text) <= MAX_EXPRESSION_LENGTH:
        assert error.expression == _as_shown(text)
        assert 0 <= column <= len(text)
    else:  # a long text is shown as the neighbourhood of the caret
        assert error.expression.strip(".") in text and len(error.expression) < 100


def test_hostile_list_is_long_enough():
    assert len(HOSTILE) >= 30


def test_module_source_has_no_eval_exec_or_compile():
    tree = ast.parse((REPO / "rasterflow" / "expr.py").read_text())
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not called & {"eval", "exec", "compile", "__import__", "getattr", "setattr"}


def test_evaluation_runs_nothing_either():
    expr = parse_expression("where(scl in (3, 8), sqrt(abs(nir)), red) + (qa >> 2 & 1)", KNOWN)
    env = {name: np.arange(6, dtype=np.float32) for name in ("nir", "red", "scl")}
    env["qa"] = np.arange(6, dtype=np.uint16)
    with _tripwires() as calls:
        expr.evaluate(env)
    assert calls == []


# --- messages ---------------------------------------------------------------------------------------------------------


def test_unknown_name_lists_known_names_and_suggests_the_closest():
    err = _reject("nri + red", ("nir", "red", "scl"))
    assert "unknown name 'nri'" in str(err)
    assert "known names: nir, red, scl" in str(err)
    assert "did you mean 'nir'?" in str(err)
    assert _caret_column(err) == 0


def test_unknown_name_without_a_close_match_makes_no_suggestion():
    err = _reject("nir + zzzz", ("nir", "red"))
    assert "known names: nir, red" in str(err) and "did you mean" not in str(err)


def test_unknown_function_suggests_an_allowed_one():
    err = _reject("sqr(nir)")
    assert "unknown function 'sqr'" in str(err) and "did you mean 'sqrt'?" in str(err)
    assert ", ".join(sorted(ALLOWED_FUNCTIONS)) in str(err)


def test_what_names_the_expression_in_the_message():
    err = _reject("nri", ("nir",), what="band 'ndvi'")
    assert str(err).startswith("invalid band 'ndvi': unknown name 'nri'")


def test_rejects_a_non_string():
    with pytest.raises(ExpressionError, match="expected text"):
        parse_expression(5, KNOWN)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "column"),
    [
        ("nir // red", 4),  # under the operator, not the left operand
        ("nir + foo(red)", 6),
        ("nir.real", 3),  # under the '.'
        ("(nir) .real", 6),
        ("nir + red[0]", 9),  # under the '['
        ("(nir) is red", 6),
        ("nir + 'x'", 6),
        ("2 ** 1000", 5),  # under the exponent
        ("sqrt(x=nir)", 5),  # under the keyword
        ("scl in (3, red)", 11),
        ("(nir +\n nri)", 8),  # a multi-line text is shown on one line, newlines as spaces
        ("(é + nri)", 5),  # ast columns are UTF-8 bytes; the caret counts characters
        ("nir + $", 6),  # a syntax error
        ("nir +", 5),  # unexpected end: after the text
        ("(" * 51 + "nir" + ")" * 51, 50),  # the first bracket too deep
    ],
)
def test_caret_is_under_the_offending_token(text, column):
    err = _reject(text, KNOWN + ("é",))
    assert err.offset == column
    assert _caret_column(err) == column


def test_evaluation_error_points_at_the_operation():
    expr = parse_expression("nir + ~red", KNOWN)
    with pytest.raises(ExpressionError, match="cannot evaluate") as info:
        expr.evaluate({"nir": np.ones(3, np.float32), "red": np.ones(3, np.float32)})
    assert _caret_column(info.value) == 6


def test_missing_input_is_reported():
    expr = parse_expression("nir - red", KNOWN)
    with pytest.raises(ExpressionError, match="no value given for red"):
        expr.evaluate({"nir": np.ones(3)})


def test_constant_division_by_zero_is_an_expression_error():
    expr = parse_expression("nir * (1 / 0)", KNOWN)
    with pytest.raises(ExpressionError, match="division by zero"):
        expr.evaluate({"nir": np.ones(3)})


# --- the parsed value -------------------------------------------------------------------------------------------------


def test_expression_fields():
    expr = parse_expression("(nir - red) / (nir + red)", KNOWN)
    assert expr.text == "(nir - red) / (nir + red)"
    assert expr.names == frozenset({"nir", "red"})
    assert not expr.is_boolean
    assert expr == parse_expression("(nir - red) / (nir + red)", KNOWN)  # the tree is not compared
    assert "_tree" not in repr(expr)
    with pytest.raises(AttributeError):
        expr.text = "nir"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "boolean"),
    [
        ("scl in (3, 8)", True),
        ("scl not in (3, 8)", True),
        ("nir > red", True),
        ("0 < nir < 1", True),
        ("isnan(nir)", True),
        ("not nir", True),
        ("nir and red", True),
        ("(nir > 0) & (red > 0) | isnan(scl)", True),
        ("~(nir > 0)", True),
        ("where(scl == 3, nir > 0, red > 0)", True),
        ("nir", False),
        ("qa & 1", False),
        ("(qa >> 3) & 1", False),
        ("where(scl == 3, nir, red)", False),
        ("nir * (scl > 3)", False),
    ],
)
def test_is_boolean(text, boolean):
    assert parse_expression(text, KNOWN).is_boolean is boolean


def test_a_name_may_be_known_and_also_a_function():
    assert parse_expression("abs(abs)", ("abs",)).names == {"abs"}


# --- liveness ---------------------------------------------------------------------------------------------------------

LIVENESS = [
    # a bare input: just itself
    ("nir", 1),
    # nir, and the product (the literal 2 is a scalar: 0)
    ("nir * 2", 2),
    # nir, and sqrt's result
    ("sqrt(nir)", 2),
    # + is nir itself: no new array
    ("+nir", 1),
    # nir, red; t1 = nir - red (3); t2 = nir + red (4: nir, red, t1, t2); t1 / t2 with both alive (5)
    ("(nir - red) / (nir + red)", 5),
    # scl, nir, red (3); scl > 3 (4); where's result while the comparison is alive (5)
    ("where(scl > 3, nir, red)", 5),
    # nir, red, scl (3); t1 = nir + red (4); t1 + scl with t1 alive (5)
    ("nir + red + scl", 5),
    # scl (1); e1 = scl == 3 (2); e2 = scl == 8 (3); e1 | e2 (4); then e1, e2 freed: one OR result (2), and each
    # further value again adds a comparison and an OR (4)
    ("scl in (3, 8, 9, 10)", 4),
    # scl (1); scl == 3 (2): a single value needs no OR
    ("scl in (3,)", 2),
    # scl (1); scl != 3 (2); scl != 8 (3); AND of both (4)
    ("scl not in (3, 8)", 4),
    # nir, red, scl (3); nir < red (4); red < scl (5); their AND (6)
    ("nir < red < scl", 6),
    # scl (1); scl == 3 (2); not (3)
    ("not (scl == 3)", 3),
    # nir, red (2); t1 = nir - red (3); t2 = t1 * 2 (4); t1 freed (3); clip of t2 (4); the bounds are scalars
    ("clip((nir - red) * 2, 0, 1)", 4),
    # qa (1); qa >> 3 (2); & 1 with the shift alive (3)
    ("(qa >> 3) & 1", 3),
    # nir, red, scl (3); nir and red (4); that and scl (5)
    ("nir and red and scl", 5),
    # 2 * 3 is a scalar (0); nir (1); the sum (2)
    ("2 * 3 + nir", 2),
    # nir, red (2); sqrt(nir) (3); abs(red) (4); minimum with both alive (5)
    ("minimum(sqrt(nir), abs(red))", 5),
]


@pytest.mark.parametrize(("text", "live"), LIVENESS)
def test_live_arrays_hand_computed(text, live):
    assert parse_expression(text, KNOWN).live_arrays == live


# Expressions whose temporaries all have one dtype, so memory measured in bytes converts to a count of arrays.
FLOAT_TEMPORARIES = [
    "(nir - red) / (nir + red)",
    "nir + red + scl",
    "clip((nir - red) * 2, 0, 1)",
    "minimum(sqrt(nir), abs(red)) * exp(-scl) + log(nir + 1)",
    "nir ** 2 - red % 0.3",
    "-(nir * red) + +scl",
]
BOOL_TEMPORARIES = [
    "scl in (3, 8, 9, 10)",
    "scl not in (3, 8)",
    "nir < red < scl",
    "(nir > 0.5) & (red < 0.5) | (scl == 3)",
    "not (nir > red) and scl != 3 or isnan(red)",
]


@pytest.mark.parametrize("text", FLOAT_TEMPORARIES + BOOL_TEMPORARIES)
def test_live_arrays_match_numpy_memory(text):
    expr = parse_expression(text, KNOWN)
    rng = np.random.default_rng(0)
    size = 2**17
    env = {name: rng.uniform(0, 10, size).round() for name in ("nir", "red", "scl")}  # float64
    temporary_bytes = size * (8 if text in FLOAT_TEMPORARIES else 1)
    tracemalloc.start()  # the inputs were allocated before: only the evaluation's own arrays are traced
    try:
        result = expr.evaluate(env)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.nbytes == temporary_bytes
    assert round(peak / temporary_bytes) == expr.live_arrays - len(expr.names)


# --- evaluation -------------------------------------------------------------------------------------------------------


def _bands(shape=(6, 8)):
    rng = np.random.default_rng(42)
    nir = rng.uniform(0, 1, shape).astype(np.float32)
    red = rng.uniform(0, 1, shape).astype(np.float32)
    red[0, :2] = 0
    nir[0, :1] = 0  # one 0/0
    scl = rng.integers(0, 12, shape).astype(np.float32)
    scl[1, 1] = np.nan
    qa = rng.integers(0, 2**16, shape, dtype=np.uint16)
    return {"nir": nir, "red": red, "scl": scl, "qa": qa}


REFERENCE = [
    ("(nir - red) / (nir + red)", lambda b: (b["nir"] - b["red"]) / (b["nir"] + b["red"])),
    ("scl in (3, 8, 9, 10)", lambda b: np.isin(b["scl"], [3, 8, 9, 10])),
    ("scl not in (3, 8)", lambda b: ~np.isin(b["scl"], [3, 8])),
    ("scl in (-1, 3.5, 4)", lambda b: np.isin(b["scl"], [-1, 3.5, 4])),
    ("where(scl in (8, 9), nir, red * 2)", lambda b: np.where(np.isin(b["scl"], [8, 9]), b["nir"], b["red"] * 2)),
    ("clip(nir * 2 - 0.5, 0, 1)", lambda b: np.clip(b["nir"] * 2 - 0.5, 0, 1)),
    ("(qa >> 3) & 1", lambda b: (b["qa"] >> 3) & 1),
    ("(qa & (1 << 4)) != 0", lambda b: (b["qa"] & 16) != 0),
    ("qa >> 2 & 3 | qa << 1", lambda b: b["qa"] >> 2 & 3 | b["qa"] << 1),
    ("not (scl == 3)", lambda b: ~(b["scl"] == 3)),
    ("0.1 < nir <= 0.6", lambda b: (0.1 < b["nir"]) & (b["nir"] <= 0.6)),
    ("nir < red < scl != 4", lambda b: (b["nir"] < b["red"]) & (b["red"] < b["scl"]) & (b["scl"] != 4)),
    ("nir > red and not isnan(scl)", lambda b: (b["nir"] > b["red"]) & ~np.isnan(b["scl"])),
    ("nir > 0.5 or red > 0.5 or scl", lambda b: (b["nir"] > 0.5) | (b["red"] > 0.5) | (b["scl"] != 0)),
    (
        "sqrt(abs(nir - red)) + exp(-nir) - log(nir)",
        lambda b: np.sqrt(np.abs(b["nir"] - b["red"])) + np.exp(-b["nir"]) - np.log(b["nir"]),
    ),
    ("minimum(nir, red) * maximum(nir, 0.5)", lambda b: np.minimum(b["nir"], b["red"]) * np.maximum(b["nir"], 0.5)),
    ("nir ** 2 + red ** 0.5 % 0.3 - 2 ** -1", lambda b: b["nir"] ** 2 + b["red"] ** 0.5 % 0.3 - 0.5),
    ("2 ** nir", lambda b: 2**b["nir"]),
    ("-nir + +red", lambda b: -b["nir"] + b["red"]),
    ("~(nir > 0.5) | (red < 0.2)", lambda b: ~(b["nir"] > 0.5) | (b["red"] < 0.2)),
    ("where(isnan(scl), 0, scl)", lambda b: np.where(np.isnan(b["scl"]), 0, b["scl"])),
    ("nir * (1 / 10000) + (-8) ** 0.5", lambda b: b["nir"] * (1 / 10000) + np.nan),
    ("where(1 < 2, nir, red) + ~(1 > 2) * abs(-3)", lambda b: b["nir"] + 3),
]


@pytest.mark.parametrize(("text", "reference"), REFERENCE, ids=[text for text, _ in REFERENCE])
def test_evaluation_matches_numpy(text, reference):
    bands = _bands()
    with np.errstate(all="ignore"):
        expected = reference(bands)
    result = parse_expression(text, KNOWN).evaluate(bands)
    assert isinstance(result, np.ndarray)
    assert result.dtype == expected.dtype
    np.testing.assert_allclose(result, expected, rtol=1e-6, equal_nan=True)


FLOAT32_ARITHMETIC = [
    "nir * 2", "nir / 10000", "nir + 0.5", "nir - 3", "nir ** 2", "nir % 3", "-nir", "sqrt(nir)", "abs(nir)",
    "clip(nir, 0, 1)", "minimum(nir, 1)", "where(nir > 0.2, nir, 0)", "(nir - red) / (nir + red)", "nir * (1 / 3)",
]


@pytest.mark.parametrize("text", FLOAT32_ARITHMETIC)
@pytest.mark.parametrize("backend", ["numpy", "dask", "xarray"])
def test_float32_stays_float32(text, backend):
    bands = {name: _BACKENDS[backend](array) for name, array in _bands().items()}
    assert parse_expression(text, KNOWN).evaluate(bands).dtype == np.float32


def test_integer_bands_stay_integer():
    bands = _bands()
    assert parse_expression("(qa >> 3) & 1", KNOWN).evaluate(bands).dtype == np.uint16


def test_import_does_not_load_dask_xarray_or_rasterio():
    code = (
        "import sys, rasterflow.expr; "
        "loaded = [m for m in ('dask', 'xarray', 'rasterio', 'stackstac', 'pystac_client') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


# --- NumPy, Dask and xarray agree -------------------------------------------------------------------------------------

_BACKENDS = {
    "numpy": lambda array: array,
    "dask": lambda array: da.from_array(array, chunks=(3, 4)),
    "xarray": lambda array: xr.DataArray(da.from_array(array, chunks=(3, 4)), dims=("y", "x")),
    "xarray-numpy": lambda array: xr.DataArray(array, dims=("y", "x")),
}


def _materialise(value):
    if isinstance(value, xr.DataArray):
        return value.values
    if isinstance(value, da.Array):
        return value.compute(scheduler="synchronous")
    return np.asarray(value)


def _outcomes(expr: Expression, bands: dict) -> dict:
    """Each backend's result as NumPy, or the exception it raised (when building or when computing)."""
    outcomes = {}
    for backend, convert in _BACKENDS.items():
        try:
            with np.errstate(all="ignore"):
                outcomes[backend] = _materialise(expr.evaluate({k: convert(v) for k, v in bands.items()}))
        except Exception as exc:  # any failure: compared across backends below
            outcomes[backend] = exc
    return outcomes


def _assert_backends_agree(expr: Expression, bands: dict) -> None:
    outcomes = _outcomes(expr, bands)
    reference = outcomes.pop("numpy")
    if isinstance(reference, Exception):
        assert isinstance(reference, ExpressionError), repr(reference)
        assert all(isinstance(outcome, Exception) for outcome in outcomes.values()), outcomes
        return
    for backend, outcome in outcomes.items():
        assert not isinstance(outcome, Exception), f"{backend}: {outcome!r}"
        assert outcome.shape == reference.shape, backend
        assert outcome.dtype == reference.dtype, backend
        np.testing.assert_allclose(outcome, reference, rtol=1e-5, equal_nan=True, err_msg=backend)


_NUMBERS = st.sampled_from(["1", "2", "3", "0.5", "1.5", "10"])


_COMPARISON_OPERATORS = st.sampled_from(["<", "<=", ">", ">=", "==", "!="])


def _conditions(numeric):
    """Comparisons, chains, membership and isnan of numeric expressions."""
    comparison = st.tuples(numeric, _COMPARISON_OPERATORS, numeric).map(" ".join)
    chain = st.tuples(numeric, _COMPARISON_OPERATORS, numeric, _COMPARISON_OPERATORS, numeric).map(" ".join)
    values = st.lists(_NUMBERS, min_size=1, max_size=3).map(lambda v: f"({', '.join(v)},)")
    membership = st.tuples(numeric, st.sampled_from(["in", "not in"]), values).map(lambda t: f"({t[0]}) {t[1]} {t[2]}")
    return st.one_of(comparison, chain, membership, numeric.map(lambda x: f"isnan({x})"))


def _numeric_extensions(children, *, with_where=True):
    return st.one_of(
        st.tuples(children, st.sampled_from(["+", "-", "*", "/", "%"]), children).map(lambda t: f"({' '.join(t)})"),
        st.tuples(children, st.sampled_from(["2", "3", "0.5", "-1"])).map(lambda t: f"({t[0]}) ** {t[1]}"),
        children.map(lambda x: f"-({x})"),
        st.tuples(st.sampled_from(["sqrt", "log", "exp", "abs"]), children).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(st.sampled_from(["minimum", "maximum"]), children, children).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        st.tuples(children, _NUMBERS, _NUMBERS).map(lambda t: f"clip({t[0]}, {t[1]}, {t[2]})"),
        *([st.tuples(_conditions(children), children, children).map(lambda t: f"where({t[0]}, {t[1]}, {t[2]})")]
          if with_where else []),
    )


_NUMERIC = st.recursive(st.one_of(st.sampled_from(["a", "b", "c"]), _NUMBERS), _numeric_extensions, max_leaves=8)
_BOOLEAN = st.recursive(
    _conditions(_NUMERIC),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["and", "or", "&", "|"]), inner).map(lambda t: f"({t[0]}) {t[1]} ({t[2]})"),
        inner.map(lambda x: f"not ({x})"),
        inner.map(lambda x: f"~({x})"),
    ),
    max_leaves=3,
)
_EXPRESSIONS = st.one_of(_NUMERIC, _BOOLEAN).filter(lambda text: re.search(r"\b[abc]\b", text))


def _float_bands():
    rng = np.random.default_rng(7)
    bands = {name: rng.uniform(-2, 5, (6, 8)).round(1).astype(np.float32) for name in "abc"}
    bands["c"][2, 3] = np.nan
    return bands


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_EXPRESSIONS)
def test_random_expressions_agree_across_numpy_dask_and_xarray(text):
    try:
        expr = parse_expression(text, "abc")
    except ExpressionError:
        assume(False)  # e.g. (1 + 2) ** 2: a constant power with a non-literal base
    _assert_backends_agree(expr, _float_bands())


_FLOAT_ONLY = st.recursive(
    st.one_of(st.sampled_from(["a", "b", "c"]), _NUMBERS),
    lambda children: _numeric_extensions(children, with_where=False),  # every temporary is a float64 array
    max_leaves=10,
).filter(lambda text: re.search(r"\b[abc]\b", text))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_FLOAT_ONLY)
def test_random_live_arrays_match_numpy_memory(text):
    try:
        expr = parse_expression(text, "abc")
    except ExpressionError:
        assume(False)
    size = 2**15
    env = {name: np.linspace(-3, 3, size) + index for index, name in enumerate("abc")}  # float64
    tracemalloc.start()
    try:
        expr.evaluate(env)
        peak = tracemalloc.get_traced_memory()[1]
    except ExpressionError:
        assume(False)  # a constant 1 / (1 - 1)
    finally:
        tracemalloc.stop()
    assert round(peak / (size * 8)) == expr.live_arrays - len(expr.names)


_INT_LEAVES = st.one_of(st.sampled_from(["q", "r"]), st.sampled_from(["0", "1", "3", "7"]))
_INTEGER = st.recursive(
    _INT_LEAVES,
    lambda children: st.one_of(
        st.tuples(children, st.sampled_from(["&", "|", "+", "*"]), children).map(lambda t: f"({' '.join(t)})"),
        st.tuples(children, st.sampled_from([">>", "<<"]), st.sampled_from(["0", "1", "3", "4"])).map(
            lambda t: f"({' '.join(t)})"
        ),
        st.tuples(children, st.sampled_from(["==", "!=", ">"]), children).map(lambda t: f"({' '.join(t)})"),
        st.tuples(children, st.lists(st.sampled_from(["0", "1", "2", "5"]), min_size=1, max_size=3)).map(
            lambda t: f"({t[0]} in ({', '.join(t[1])},))"
        ),
    ),
    max_leaves=8,
).filter(lambda text: re.search(r"\b[qr]\b", text))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_INTEGER)
def test_random_bit_expressions_agree_across_backends(text):
    rng = np.random.default_rng(3)
    bands = {name: rng.integers(0, 2**12, (6, 8), dtype=np.uint16) for name in "qr"}
    _assert_backends_agree(parse_expression(text, "qr"), bands)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_EXPRESSIONS)
def test_random_expressions_stay_lazy_on_dask(text):
    try:
        expr = parse_expression(text, "abc")
    except ExpressionError:
        assume(False)
    _assert_lazy(expr, "abc")


def _exploding(shape=(6, 8), dtype=np.float32):
    """A Dask array whose every chunk raises when computed."""

    def explode(block):
        raise AssertionError("a chunk was computed")

    return da.zeros(shape, chunks=(3, 4), dtype=dtype).map_blocks(explode, dtype=dtype, meta=np.empty((0, 0), dtype))


def _assert_lazy(expr: Expression, names) -> None:
    env = {name: _exploding() for name in names}
    try:
        result = expr.evaluate(env)
    except ExpressionError:
        return  # failed while building the graph (a constant 1 / 0, say): nothing ran either
    assert isinstance(result, da.Array)
    wrapped = expr.evaluate({name: xr.DataArray(array, dims=("y", "x")) for name, array in env.items()})
    assert isinstance(wrapped, xr.DataArray) and isinstance(wrapped.data, da.Array)


def test_the_exploding_array_does_explode():
    result = parse_expression("nir * 2", ("nir",)).evaluate({"nir": _exploding()})
    with pytest.raises(AssertionError, match="a chunk was computed"):
        result.compute(scheduler="synchronous")


@pytest.mark.parametrize("text", [text for text, _ in REFERENCE if "qa" not in text])
def test_reference_expressions_stay_lazy(text):
    _assert_lazy(parse_expression(text, KNOWN), ("nir", "red", "scl"))


def test_where_with_xarray_keeps_coordinates():
    data = da.from_array(np.arange(4, dtype=np.float32), chunks=2)
    nir = xr.DataArray(data, dims="x", coords={"x": [10, 20, 30, 40]})
    result = parse_expression("where(nir > 1, nir, 0)", ("nir",)).evaluate({"nir": nir})
    assert isinstance(result.data, da.Array)
    assert list(result.x.values) == [10, 20, 30, 40]
    np.testing.assert_array_equal(result.values, [0, 0, 2, 3])


@pytest.mark.parametrize("text, plain", [
    ("(nir - red) / (nir + red)", lambda red, nir, blue: (nir - red) / (nir + red)),
    ("2.5 * (nir - red) / (nir + 6 * red - 7.5 * blue + 1)",
     lambda red, nir, blue: 2.5 * (nir - red) / (nir + 6 * red - 7.5 * blue + 1)),
    ("nir - red", lambda red, nir, blue: nir - red),                        # the root reads inputs only
    ("sqrt(nir) * 2 - red / 3", lambda red, nir, blue: np.sqrt(nir) * 2 - red / 3),
    ("(nir - red) / (nir + red) > 0.2", lambda red, nir, blue: (nir - red) / (nir + red) > 0.2),  # boolean
    ("where(nir > red, nir - red, 0) + 1", lambda red, nir, blue: np.where(nir > red, nir - red, 0) + 1),
    ("1 - red", lambda red, nir, blue: 1 - red),                            # a scalar on the left
    ("red", lambda red, nir, blue: red),                                    # no operation at all
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_out_gets_the_plain_values_and_inputs_are_left_alone(text, plain, dtype):
    """The last operation may write into the caller's ``out``: the values are those of a plain NumPy evaluation,
    the inputs are untouched, and an ``out`` of another dtype than the result's is not written."""
    rng = np.random.default_rng(4)
    env = {name: rng.random((6, 7)).astype(dtype) + 0.1 for name in ("red", "nir", "blue")}
    env["red"][0, 0] = np.nan
    before = {k: v.copy() for k, v in env.items()}
    expression = parse_expression(text, list(env))
    with np.errstate(all="ignore"):
        reference = plain(**before)
        out = np.full((6, 7), -1.0, dtype=dtype)
        written = expression.evaluate(dict(env), out=out)
    for name, value in env.items():
        np.testing.assert_array_equal(value, before[name])
    np.testing.assert_array_equal(written, reference)
    assert np.asarray(written).dtype == np.asarray(reference).dtype
    if text in ("red", "(nir - red) / (nir + red) > 0.2"):
        assert written is not out and (out == -1.0).all()  # an input itself / a boolean result: out untouched
    else:
        assert written is out


def test_out_of_another_shape_or_dtype_is_not_written():
    expression = parse_expression("a * 2 + b", ["a", "b"])
    a, b = np.arange(6.0).reshape(2, 3), np.ones(3)
    for out in (np.zeros((2, 3), np.float32), np.zeros((3, 2)), np.zeros((2, 3), np.float64)[:, :1]):
        result = expression.evaluate({"a": a, "b": b}, out=out)
        assert result is not out and not out.any()
        np.testing.assert_array_equal(result, a * 2 + b)
