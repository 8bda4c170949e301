"""Symbolic gradients (einfuse.autodiff) against central finite differences.

Every check runs the derived statements with the NumPy reference (run_reference) and
compares with (L(x + h) - L(x - h)) / 2h of L = sum(forward(x) * dOUT), in float64,
on small random arrays whose values stay away from kinks and ties.
"""

import warnings

import numpy as np
import pytest

import einfuse as ef
from einfuse.autodiff import GradientStatement, NoGradientError, derive
from einfuse import run_reference
from einfuse.runtime.gradient_reference import resolve_options

H = 1e-6


def forward(statement, arrays, options):
    """Run a forward statement (a GradientStatement brings its own options)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if isinstance(statement, GradientStatement):
            opts = resolve_options(statement, arrays)
            args = {n: arrays[n] for n in statement.inputs}
            return np.asarray(ef.ein(statement.text, backend="numpy", **opts, **args))
        spec = ef.compile(statement, **options).spec
        args = {n: arrays[n] for n in spec.arg_order}
        if spec.assign != ":=":    # '=' / '+=' write into a copy of the output
            args[spec.output] = np.array(arrays[spec.output], dtype=float)
        return np.asarray(ef.ein(statement, backend="numpy", **options, **args))


def check(statement, wrts, arrays, options=None, seed=0, rtol=1e-6, atol=1e-7):
    """Derive ``statement`` for each name in ``wrts`` and compare with finite
    differences; returns the gradient statements (for text checks)."""
    options = dict(options or {})
    rng = np.random.default_rng(seed)
    out = forward(statement, arrays, options)
    first = derive(statement, wrts[0], options=options)
    dname = first[0].output_grad
    arrays = dict(arrays, **{dname: rng.standard_normal(out.shape)})
    found = {}
    for wrt in wrts:
        grads = derive(statement, wrt, options=options)
        got = run_reference(grads, arrays)[grads[0].target]
        base = np.asarray(arrays[wrt], dtype=float)
        want = np.zeros(base.shape)
        for pos in np.ndindex(base.shape):
            total = []
            for step in (H, -H):
                moved = base.copy()
                moved[pos] += step
                value = moved if moved.ndim else float(moved)
                total.append(np.sum(forward(statement, dict(arrays, **{wrt: value}),
                                            options) * arrays[dname]))
            want[pos] = (total[0] - total[1]) / (2 * H)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                   err_msg=f"d/d{wrt} of {statement}: "
                                           + "; ".join(g.description for g in grads))
        found[wrt] = grads
    return found


def rand(*shape, seed=1, low=-1.0, high=1.0):
    return np.random.default_rng(seed + 7 * len(shape)).uniform(low, high, shape)


# -- the texts of a few gradients -------------------------------------------------------
def test_matmul_gradient_texts():
    (ga,) = derive("C[i,j] := A[i,k]*B[k,j]", "A")
    assert ga.text == "dA[i, k] := dC[i, j] * B[k, j]"
    assert (ga.kind, ga.target, ga.options["pad"]) == ("gather", "dA", None)
    (gb,) = derive("C[i,j] := A[i,k]*B[k,j]", "B")
    assert gb.text == "dB[k, j] := dC[i, j] * A[i, k]"
    assert gb.spec.output_indices == ("k", "j")


def test_conv_gradient_is_a_padded_gather_in_its_own_frame():
    (g,) = derive("y[i] := x[i+a]*k[a]", "x")
    assert g.text == "dx[j] := dy[j - a] * k[a]"
    assert g.kind == "gather" and g.options["pad"] == 0.0
    assert g.options["ranges"]["j"].tensor == "x"


def test_strided_gather_and_repeated_index_are_scatters():
    (g,) = derive("y[i] := x[2*i+a]*k[a]", "x")
    assert g.kind == "scatter" and g.description == "dx[2*i + a] += dy[i] * k[a]"
    (g,) = derive("E[b,d] := W[idx[b], d]", "W")
    assert g.kind == "scatter" and g.description == "dW[idx[b], d] += dE[b, d]"
    (g,) = derive("y[i] := A[i,i]", "A")
    assert g.kind == "scatter" and g.description == "dA[i, i] += dy[i]"


def test_output_grad_name_and_errors():
    (g,) = derive("C[i,j] := A[i,k]*B[k,j]", "A", output_grad_name="G")
    assert g.text == "dA[i, k] := G[i, j] * B[k, j]"
    with pytest.raises(NoGradientError, match="idx"):
        derive("E[b,d] := W[idx[b], d]", "idx")
    with pytest.raises(ef.EinfuseError, match="zz"):
        derive("C[i,j] := A[i,k]*B[k,j]", "zz")


# -- finite differences ------------------------------------------------------------------
def test_matmul():
    check("C[i,j] := A[i,k]*B[k,j]", ["A", "B"], {"A": rand(3, 4), "B": rand(4, 5)})


def test_dist_both():
    check("D[i,j] := (w[k,i]-x[k,j])**2", ["w", "x"], {"w": rand(3, 4), "x": rand(3, 5)})


def test_linear_layer():
    check("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", ["x", "W", "bias"],
          {"x": rand(2, 3), "W": rand(3, 4), "bias": rand(4)})


def test_conv_both():
    check("y[i] := x[i+a]*k[a]", ["x", "k"], {"x": rand(7), "k": rand(3)})


def test_strided_conv():
    check("y[i] := x[2*i+a]*k[a]", ["x", "k"], {"x": rand(9), "k": rand(3)})


def test_conv_2d():
    check("o[i,j] := img[i+a,j+b]*ker[a,b]", ["img", "ker"],
          {"img": rand(5, 6), "ker": rand(2, 3)})


def test_shifted_reads_with_functions_need_the_seed_gate():
    # z[i] padded with 0 outside would give log(0) = -inf; the gate keeps it out
    check("y[i] := x[i+a] * log(z[i]) * k[a]", ["x", "z", "k"],
          {"x": rand(6), "z": rand(4, low=0.5, high=2.0), "k": rand(3)})


def test_narrowed_reduction_index_falls_back_to_scatter():
    check("s := sum[i](x[i]*z[i+1])", ["x", "z"], {"x": rand(5), "z": rand(5)})


def test_embedding_with_repeated_indices():
    idx = np.array([2, 0, 2, 3, 2])
    check("E[b,d] := W[idx[b], d] * s[b]", ["W", "s"],
          {"W": rand(4, 3), "s": rand(5), "idx": idx})


def test_repeated_index_on_the_right():
    check("y[i] := A[i,i] * v[i]", ["A", "v"], {"A": rand(3, 3), "v": rand(3)})


def test_gauss():
    check("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])", ["x", "y", "b"],
          {"x": rand(3, 2), "y": rand(4, 2), "b": rand(4)})


def test_logsumexp():
    check("l[i] := logsumexp[j](x[i,j])", ["x"], {"x": rand(3, 4)})


def test_max_min_reductions_without_ties():
    check("m[i] := max[j](x[i,j]) - min[j](x[i,j] * 2)", ["x"], {"x": rand(3, 5)})
    check("m := max[i,j](x[i,j])", ["x"], {"x": rand(3, 4)})


def test_max_reduction_gradient_goes_to_the_first_of_ties():
    grads = derive("m[i] := max[j](x[i,j])", "x")
    x = np.array([[1.0, 3.0, 3.0, 2.0]])
    got = run_reference(grads, {"x": x, "dm": np.ones(1)})["dx"]
    np.testing.assert_array_equal(got, [[0.0, 1.0, 0.0, 0.0]])


def test_prod_with_a_zero():
    x = rand(2, 4)
    x[0, 1] = 0.0
    check("p[i] := prod[j](x[i,j])", ["x"], {"x": x})


@pytest.mark.parametrize("func,low,high", [
    ("exp", -1, 1), ("log", 0.5, 2), ("log1p", -0.5, 1), ("expm1", -1, 1),
    ("sqrt", 0.5, 2), ("abs", 0.2, 1), ("sin", -2, 2), ("cos", -2, 2), ("tanh", -2, 2),
    ("sigmoid", -2, 2), ("relu", 0.2, 1), ("softplus", -2, 2), ("erf", -1, 1),
    ("floor", 0.2, 0.8), ("ceil", 0.2, 0.8)])
def test_unary_functions(func, low, high):
    x = rand(5, low=low, high=high)
    if func in ("abs", "relu"):
        x[::2] *= -1     # both sides of the kink, away from it
    check(f"y[i] := {func}(x[i]) * w[i]", ["x", "w"], {"x": x, "w": rand(5)})


def test_operators():
    arrays = {"a": rand(4, low=0.5, high=2), "b": rand(4, low=0.5, high=2, seed=3)}
    check("y[i] := a[i] / b[i] - a[i] ** b[i] + pow(b[i], 3) - -a[i] + b[i]**2",
          ["a", "b"], arrays)


def test_min_max_where_and_comparisons():
    arrays = {"a": rand(6), "b": rand(6, seed=5)}
    check("y[i] := min(a[i], b[i]) * 2 + max(a[i], b[i]) ** 2", ["a", "b"], arrays)
    check("y[i] := where(a[i] > b[i], a[i] * b[i], b[i] - a[i]) + (a[i] > 0) * i",
          ["a", "b"], arrays)


def test_scalar_parameter_and_index_values():
    (g,) = derive("y[i] := alpha * x[i] / (i + 1) + alpha**2", "alpha")
    assert g.text.startswith("dalpha := ")
    check("y[i] := alpha * x[i] / (i + 1) + alpha**2", ["alpha", "x"],
          {"alpha": 0.7, "x": rand(4)})


def test_nested_finalisers():
    check("N[i] := sqrt(sum[j](X[i,j]**2)) + log(sum[j](exp(X[i,j] - M[i])))",
          ["X", "M"], {"X": rand(3, 4), "M": rand(3)})


def test_second_derivatives():
    # the gradient statements are ordinary statements: derive them again and check them
    # against finite differences of the first gradient
    (g,) = derive("y[i] := x[i+a]*k[a]", "x")
    check(g, ["dy", "k"], {"x": rand(7), "k": rand(3), "dy": rand(5, seed=4)})
    (g,) = derive("y[i] := exp(x[i,j] * w[j])", "x")
    check(g, ["x", "w"], {"x": rand(3, 2), "w": rand(2), "dy": rand(3, seed=4)})


def test_forward_options_and_forms():
    # a 'same' convolution run with pad=0 and an explicit output range
    check("y[i] := x[i + a - 1] * k[a]", ["x", "k"], {"x": rand(6), "k": rand(3)},
          options={"pad": 0, "ranges": {"i": 6}})
    # out-of-range gathers clipped: the clipped reads feed the edge rows
    check("E[b,d] := W[idx[b] + 1, d]", ["W"],
          {"W": rand(3, 2), "idx": np.array([0, 1, 2, -3])}, options={"bounds": "clip"})
    # '+=' forward, scalar output, 0-d input
    check("C[i,j] += A[i,k]*B[k,j]", ["A"], {"A": rand(2, 3), "B": rand(3, 2),
                                            "C": np.zeros((2, 2))})
    check("s := x[i] * y[i] * m[]", ["x", "m"], {"x": rand(4), "y": rand(4),
                                                "m": np.array(0.5)})


def test_gradient_kernels_tell_fill_minus_zero_from_zero():
    # 0.0 == -0.0: the gradient kernels' cache gave fill=-0.0 the kernel of fill=0.0
    x, w, idx, dy = np.arange(1.0, 6.0), np.ones(2), np.array([0, 9]), np.ones(2)
    for fill in (0.0, -0.0):
        grads = derive("y[b] := w[b] / x[idx[b]]", "w",
                       options={"bounds": "fill", "fill": fill})
        got = run_reference(grads, {"w": w, "x": x, "idx": idx, "dy": dy})["dw"]
        assert got[1] == np.inf * np.copysign(1.0, fill)


def test_runtime_gradients_tell_fill_minus_zero_from_zero():
    from einfuse.analysis.options import make_options
    from einfuse.runtime.gradients import compute_gradients
    x, w, idx, dy = np.arange(1.0, 6.0), np.ones(2), np.array([0, 9]), np.ones(2)
    for fill in (0.0, -0.0):
        got = compute_gradients("y[b] := w[b] / x[idx[b]]",
                                make_options(bounds="fill", fill=fill),
                                {"w": w, "x": x, "idx": idx}, dy, ["w"])["w"]
        assert got[1] == np.inf * np.copysign(1.0, fill)
