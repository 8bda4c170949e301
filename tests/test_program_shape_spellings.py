"""A program's shape does not depend on how an intermediate's commutative terms are
written: rewrite/canonical.canonical_program brings every statement to its own fixed
point before deciding what is put back into its reader or recomputed there, so
`y := 0.5 + X; z := sum(y)` and `y := X + 0.5; z := sum(y)` are one program (before,
a rule that fired on the intermediate's own terms put it back into its reader for the
one spelling only: one statement against two, another kernel).  Values against NumPy
in float64, on every backend."""

import itertools
import re

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import spec_of
from einfuse.lang.split import split_program
from einfuse.rewrite.canonical import canonical_program

# an intermediate written two ways the rules make one, and its NumPy value
INTERMEDIATES = [
    ("X[i,j] + 0.5", "0.5 + X[i,j]", lambda X, m, b: X + 0.5),
    ("X[i,j] - m[i]", "-m[i] + X[i,j]", lambda X, m, b: X - m[:, None]),
    ("(X[i,j] - m[i])**2", "(m[i] - X[i,j])**2", lambda X, m, b: (X - m[:, None]) ** 2),
    ("X[i,j] + b[j]", "b[j] + X[i,j]", lambda X, m, b: X + b[None, :]),
    ("exp(X[i,j] - m[i])", "exp(-m[i] + X[i,j])", lambda X, m, b: np.exp(X - m[:, None])),
    ("X[i,j] * X[i,j] + b[j]", "b[j] + X[i,j]**2", lambda X, m, b: X * X + b[None, :]),
]

# a reader of y (read once inside a reduction, read at its own point, read twice)
READERS = [
    ("z[i] := sum[j](y[i,j])", lambda y, W: y.sum(1)),
    ("z[i] := max[j](y[i,j])", lambda y, W: y.max(1)),
    ("z[i] := sum[j](y[i,j] * W[i,j])", lambda y, W: (y * W).sum(1)),
    ("z[i,j] := y[i,j] / sum[k](y[i,k])", lambda y, W: y / y.sum(1, keepdims=True)),
    ("z[i,j] := W[i,j] * y[i,j]", lambda y, W: W * y),
]

CASES = list(itertools.product(range(len(INTERMEDIATES)), range(len(READERS))))


def program(intermediate: str, reader: str) -> str:
    return f"y[i,j] := {intermediate}\n{reader}"


def canonical_texts(text: str):
    specs = [spec_of(piece.text) for piece in split_program(text)]
    return canonical_program([(s.statement, s.rhs) for s in specs],
                             (specs[-1].output,)).texts


@pytest.mark.parametrize("at, read", CASES,
                         ids=[f"{a}-{r}" for a, r in CASES])
def test_two_spellings_are_one_canonical_program(at, read):
    first, second, _ = INTERMEDIATES[at]
    reader, _ = READERS[read]
    one, other = (canonical_texts(program(s, reader)) for s in (first, second))
    assert one == other


@pytest.mark.parametrize("at, read", CASES[::3], ids=[f"{a}-{r}" for a, r in CASES[::3]])
def test_two_spellings_give_numpys_values(backend, at, read):
    rng = np.random.default_rng(at * 10 + read)
    X, W = rng.standard_normal((6, 7)), rng.standard_normal((6, 7))
    m, b = rng.standard_normal(6), rng.standard_normal(7)
    first, second, value = INTERMEDIATES[at]
    reader, read_value = READERS[read]
    expected = read_value(value(X, m, b), W)
    for spelling in (first, second):
        text = program(spelling, reader)
        given = {k: v for k, v in dict(X=X, W=W, m=m, b=b).items() if re.search(rf"\b{k}\[", text)}
        got = np.asarray(ef.compile(text, backend=backend)(**given))
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=text)


def test_the_fused_schedule_is_one_for_both_spellings():
    """explain's account of how the program runs (kernels, what is materialised) is
    the same for both spellings."""
    shapes = {"X": (64, 128)}

    def how_it_runs(text):
        report = str(ef.explain(text, shapes=shapes))
        return report[report.index("How it runs"):report.index("Cost")]

    assert how_it_runs("y[i,j] := 0.5 + X[i,j]\nz[i] := sum[j](y[i,j])") == \
        how_it_runs("y[i,j] := X[i,j] + 0.5\nz[i] := sum[j](y[i,j])")
