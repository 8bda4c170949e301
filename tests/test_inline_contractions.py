"""An intermediate read as an operand of a contraction stays a statement, so that the
product runs on BLAS (rewrite/inline_reductions.contraction_operand): an MLP block's
normalised input and its activation, against the same program's values in NumPy; an
intermediate read elsewhere is still put back where a rule then fires."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.schedule.choose import choose
from einfuse.schedule.schedule import Route

MLP = ("r[b] := sqrt(sum[d](X[b,d]**2) / 16 + 0.000001)\n"
       "n[b,d] := X[b,d] / r[b] * G[d]\n"
       "h[b,f] := sum[d](n[b,d] * W1[d,f])\n"
       "g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))\n"
       "y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])")


def _inputs(rng):
    return {"X": rng.standard_normal((8, 16)), "G": rng.standard_normal(16),
            "W1": rng.standard_normal((16, 32)), "W2": rng.standard_normal((32, 16))}


def _numpy(X, G, W1, W2):
    from math import erf
    n = X / np.sqrt((X ** 2).sum(1, keepdims=True) / 16 + 1e-6) * G
    h = n @ W1
    g = 0.5 * h * (1 + np.vectorize(erf)(h * 0.7071067811865476))
    return X + g @ W2


def test_the_products_operands_stay_statements():
    program = ef.compile(MLP, backend="numpy")
    outputs = [s.output for s in program.statements]
    assert outputs == ["r", "n", "h", "g", "y"]
    arrays = _inputs(np.random.default_rng(0))
    np.testing.assert_allclose(program(**arrays), _numpy(**arrays), rtol=1e-10)


@pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
def test_the_products_reach_blas():
    program = ef.compile(MLP, backend="c")
    arrays = _inputs(np.random.default_rng(1))
    np.testing.assert_allclose(program(**arrays), _numpy(**arrays), rtol=1e-10)
    env = dict(arrays)
    for statement in program.statements:
        kernel = statement.kernel
        call = kernel.bind(arrays={n: env[n] for n in kernel.spec.arg_order})
        if statement.output == "h":
            assert choose(kernel, call).route in (Route.BLAS, Route.BLAS_THEN_ADDEND)
        env[statement.output] = np.asarray(kernel(arrays={n: env[n]
                                                          for n in kernel.spec.arg_order}))


def test_a_reciprocal_read_outside_a_product_is_still_put_back():
    source = ("m[i] := sum[j](X[i,j]) / 8\nv[i] := sum[j]((X[i,j] - m[i])**2) / 8\n"
              "s[i] := 1 / sqrt(v[i] + 0.00001)\nY[i,j] := (X[i,j] - m[i]) * s[i]")
    program = ef.compile(source, backend="numpy")
    assert "s" not in [s.output for s in program.statements]
    X = np.random.default_rng(2).standard_normal((5, 8))
    c = X - X.mean(1, keepdims=True)
    np.testing.assert_allclose(program(X=X), c / np.sqrt((c ** 2).mean(1, keepdims=True)
                                                         + 1e-5), rtol=1e-10)
