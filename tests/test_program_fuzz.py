"""Hypothesis-generated programs (row-wise chains of elementwise statements, row
reductions and statements with an inner reduction that hoisting takes out) on the C
backend -- fused where the scheduler allows, and on the prepared run of a repeated
call -- against the NumPy reference backend (the interpreter of record, itself checked
against tests/oracle.py's loops) and, at small sizes, against the oracle directly."""

from typing import List

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import einfuse as ef
from einfuse.backends.c import build as c_build

from oracle import brute_force

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="compares the C backend with the reference")


@st.composite
def expressions(draw, names2: List[str], names1: List[str], col: str, depth: int = 0):
    """An expression at [i, col]: reads 2-D names at [i,col], 1-D names at [i], g[col]."""
    leaves = [f"{n}[i,{col}]" for n in names2] + [f"{n}[i]" for n in names1] + \
        [f"g[{col}]", "0.5", "-1.25"]
    if depth >= 2 or draw(st.booleans()):
        return draw(st.sampled_from(leaves))
    a = draw(expressions(names2, names1, col, depth + 1))
    b = draw(expressions(names2, names1, col, depth + 1))
    form = draw(st.sampled_from(["{a} + {b}", "{a} - {b}", "{a} * {b}",
                                 "{a} / (1 + abs({b}))", "exp(-abs({a}))",
                                 "sqrt(abs({a}) + 0.25)", "max({a}, {b})", "min({a}, {b})",
                                 "abs({a})"]))
    return "(" + form.format(a=a, b=b) + ")"


@st.composite
def programs(draw):
    names2, names1, lines = ["X"], [], []
    for number in range(draw(st.integers(2, 4))):
        name = f"t{number}"
        kind = draw(st.sampled_from(["elementwise", "reduce", "inner"]))
        body = draw(expressions(names2, names1, "j"))
        if "[i" not in body or (",j]" not in body and "[j]" not in body):
            body = f"{body} + X[i,j]"      # the ranges of i and j come from reads
        if kind == "elementwise":
            lines.append(f"{name}[i,j] := {body}")
            names2.append(name)
        elif kind == "reduce":
            op = draw(st.sampled_from(["sum", "max", "min"]))
            lines.append(f"{name}[i] := {op}[j]({body})")
            names1.append(name)
        else:
            inner = draw(expressions(names2, names1, "k"))
            if ",k]" not in inner and "[k]" not in inner:
                inner = f"{inner} * g[k]"
            op = draw(st.sampled_from(["sum", "max"]))
            lines.append(f"{name}[i,j] := {body} / (1 + abs({op}[k]({inner})))")
            names2.append(name)
    last = lines[-1].split("[", 1)[0]
    return "\n".join(lines), last


def _inputs(rng, rows, cols, dtype):
    return {"X": rng.standard_normal((rows, cols)).astype(dtype),
            "g": rng.standard_normal(cols).astype(dtype)}


def _used(source, arrays):
    return {name: value for name, value in arrays.items() if f"{name}[" in source}


def check_program_on_c(program, shape, dtype, seed):
    source, last = program
    rng = np.random.default_rng(seed)
    compiled = ef.compile(source, backend="c", outputs=[last])
    reference = ef.compile(source, backend="numpy", outputs=[last])
    rtol, atol = (1e-9, 1e-12) if dtype == np.float64 else (2e-4, 1e-5)
    for _ in range(3):      # the first call groups and prepares, the others repeat
        arrays = _used(source, _inputs(rng, *shape, dtype))
        got, expected = compiled(**arrays), reference(**arrays)
        assert got.dtype == expected.dtype
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=source)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from([(70, 64), (129, 33), (64, 100), (5, 7)]),
       st.sampled_from([np.float64, np.float32]), st.integers(0, 2**32 - 1))
def test_program_on_c_matches_the_reference(program, shape, dtype, seed):
    check_program_on_c(program, shape, dtype, seed)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from([(70, 64), (129, 33), (64, 100), (5, 7)]),
       st.sampled_from([np.float64, np.float32]), st.integers(0, 2**32 - 1))
def test_more_programs_on_c_match_the_reference(program, shape, dtype, seed):
    check_program_on_c(program, shape, dtype, seed)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**32 - 1))
def test_small_program_matches_the_oracle(program, seed):
    source, last = program
    rng = np.random.default_rng(seed)
    rows, cols = 3, 4
    arrays = _used(source, _inputs(rng, rows, cols, np.float64))
    got = ef.compile(source, backend="c", outputs=[last])(**arrays)
    np.testing.assert_allclose(got, oracle(source, arrays, rows, cols), rtol=1e-9,
                               atol=1e-12, err_msg=source)


def oracle(source: str, arrays, rows: int, cols: int) -> np.ndarray:
    """The program's last statement by tests/oracle.py's loops, statement by statement."""
    env = dict(arrays)
    for line in source.splitlines():
        name = line.split("[", 1)[0]
        used = {n: v for n, v in env.items() if f"{n}[" in line.split(":=", 1)[1]}
        ranges = {"i": (0, rows), "j": (0, cols)}
        if "[k]" in line:
            ranges["k"] = (0, cols)
        env[name] = np.asarray(brute_force(line, ranges, used), dtype=np.float64)
    return env[name]
