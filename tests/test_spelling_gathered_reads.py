"""rewrite/gathered_reads.py: an intermediate read only through gathers is read at its
gathered points (``-Y[n, y[n]]`` of a log-softmax intermediate is the one-statement
cross-entropy).  Values against tests/oracle.py run on the statements as written, NaN,
infinities and -0.0 included, on every backend; the bounds policies keep their meaning
(the same error, the same positions; ``"fill"`` left as written); where a condition
fails nothing changes."""

import math

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.spec import spec_of
from einfuse.errors import EinfuseError
from einfuse.lang.split import split_program
from einfuse.rewrite.canonical import canonical_program
from test_rewrite_rules import oracle_program, same_bits, special_matrix

INF, NAN = math.inf, math.nan

LOG_SOFTMAX_AT_LABEL = "Y[n,c] := X[n,c] - logsumexp[k](X[n,k])\nL[n] := -Y[n, y[n]]"


def canonical(source, bounds="check", outputs=None):
    specs = [spec_of(piece.text) for piece in split_program(source)]
    outputs = outputs or (specs[-1].output,)
    return canonical_program([(s.statement, s.rhs) for s in specs], outputs,
                             options=frozenset({f"bounds={bounds}"}))


def labels(rows, cols, seed=1):
    return np.random.default_rng(seed).integers(0, cols, rows).astype(np.int64)


SPECIAL_PROGRAMS = [
    LOG_SOFTMAX_AT_LABEL,
    # plain reads of other arrays beside the gathered one, a gain read at the label
    "Y[n,c] := (X[n,c] - max[k](X[n,k])) * g[c]\nL[n] := Y[n, y[n]] + 1",
    # the gathered index first, two reads of the intermediate
    "Y[c,n] := X[n,c] * 2 - sum[k](X[n,k])\nL[n] := Y[y[n], n] - Y[y[n], n] * 0.5",
]


@pytest.mark.parametrize("source", SPECIAL_PROGRAMS)
def test_a_gathered_intermediate_is_read_at_its_points(backend, source):
    form = canonical(source)
    assert len(form.statements) == 1
    assert any("read at its gathered points" in step for step in form.shared)
    X = special_matrix(6, 6)
    X[5, :] = -INF                     # a row of -inf: logsumexp -inf, NaN as written
    y = np.array([3, 0, 1, 2, 3, 4])   # labels on NaN, inf, -inf, -0.0 entries and not
    arrays = {"X": X, "y": y, "g": np.array([1.0, -0.0, INF, 2.0, -1.5, 0.5])}
    given = {k: v for k, v in arrays.items() if f"{k}[" in source}
    expected = oracle_program(source, given)["L"]
    assert np.isnan(expected).any() and not np.isnan(expected).all()
    got = np.asarray(ef.ein(source, **given, backend=backend))
    # (the same operations on the same elements: the same bits, the row kernel's
    # logsumexp to rounding)
    finite = np.isfinite(expected)
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    assert np.array_equal(got[~finite & ~np.isnan(expected)],
                          expected[~finite & ~np.isnan(expected)])
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-12, atol=1e-14)


def test_the_step_keeps_bits_where_the_kernel_does(backend):
    # no reduction in the intermediate: bitwise the statements' values
    source = "Y[n,c] := X[n,c] * g[c] - X[n,c]\nL[n] := -Y[n, y[n]]"
    X, g = special_matrix(6, 6), np.array([1.0, -0.0, INF, 2.0, -1.5, 0.5])
    y = np.array([3, 0, 1, 2, 3, 4])
    expected = oracle_program(source, {"X": X, "g": g, "y": y})["L"]
    assert len(canonical(source).statements) == 1
    assert same_bits(ef.ein(source, X=X, g=g, y=y, backend=backend), expected)


def test_an_out_of_range_label_raises_the_same_error(backend):
    X, y = np.random.default_rng(0).standard_normal((4, 5)), np.array([0, 5, 1, 2])
    with pytest.raises(ef.OutOfBoundsError if hasattr(ef, "OutOfBoundsError")
                       else EinfuseError) as raised:
        ef.ein(LOG_SOFTMAX_AT_LABEL, X=X, y=y, backend=backend)
    assert isinstance(raised.value, (EinfuseError, IndexError))
    assert "y" in str(raised.value) and "5" in str(raised.value)


@pytest.mark.parametrize("bounds", ["clip", "wrap"])
def test_clip_and_wrap_read_the_same_positions(backend, bounds):
    X = np.random.default_rng(2).standard_normal((5, 4))
    y = np.array([-1, 4, 7, 0, -6])
    assert len(canonical(LOG_SOFTMAX_AT_LABEL, bounds).statements) == 1
    n = np.arange(5)
    position = np.clip(y, 0, 3) if bounds == "clip" else y % 4
    m = X.max(axis=1)
    expected = -(X[n, position] - (m + np.log(np.exp(X - m[:, None]).sum(axis=1))))
    got = ef.ein(LOG_SOFTMAX_AT_LABEL, X=X, y=y, bounds=bounds, backend=backend)
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_fill_is_left_as_written(backend):
    # under "fill" the intermediate read out of range is fill=, not the expression of it
    assert len(canonical(LOG_SOFTMAX_AT_LABEL, "fill").statements) == 2
    X = np.random.default_rng(3).standard_normal((3, 4))
    got = np.asarray(ef.ein(LOG_SOFTMAX_AT_LABEL, X=X, y=np.array([9, 1, -1]),
                            bounds="fill", fill=2.5, backend=backend))
    assert got[0] == got[2] == -2.5


@pytest.mark.parametrize("source, outputs", [
    # the gathered index used as a value, in an affine subscript, inside an index array
    ("Y[n,c] := where(c == 0, X[n,c], 0)\nL[n] := Y[n, y[n]]", None),
    ("Y[n,c] := X[n,c] + X[n,c+1]\nL[n] := Y[n, y[n]]", None),
    ("Y[n,c] := X[n, t[c]]\nL[n] := Y[n, y[n]]", None),
    # read plainly elsewhere too, an output, an intermediate that is an index array
    ("Y[n,c] := X[n,c] * 2\nL[n] := Y[n, y[n]] + sum[c](Y[n,c])", None),
    ("Y[n,c] := X[n,c] * 2\nL[n] := Y[n, y[n]]", ("Y", "L")),
])
def test_where_a_condition_fails_the_intermediate_stays(source, outputs):
    form = canonical(source, outputs=outputs)
    assert not any("gathered points" in step for step in form.shared)


def test_the_reduced_index_of_the_intermediate_captures_no_reader_name(backend):
    # the reader's own index is named as the intermediate's reduced one
    source = "Y[n,c] := X[n,c] - logsumexp[k](X[n,k])\nL[k] := -Y[k, y[k]]"
    X, y = np.random.default_rng(4).standard_normal((5, 6)), labels(5, 6)
    expected = oracle_program(source, {"X": X, "y": y})["L"]
    assert len(canonical(source).statements) == 1
    np.testing.assert_allclose(ef.ein(source, X=X, y=y, backend=backend), expected,
                               rtol=1e-12)
