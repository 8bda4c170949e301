"""Spec section 5, the elementwise additions: the functions sign, tan and atan2 and the
operators // and % (NumPy's floor_divide and mod) on every backend, compared with NumPy
element by element (signed zeros, infinities, NaN, zero divisors, negative and extreme
integers, int and float dtypes and their mixtures); their gradients (torch gradcheck in
float64, JAX), and the error for a gradient that could only pass through sign, // or %."""

import itertools

import numpy as np
import pytest

import einfuse as ef
from einfuse import errors
from einfuse.autodiff import derive, tangent
from einfuse.lang import parse
from einfuse.lang.ast import Binary
from einfuse.lang.printer import format_statement
from oracle import brute_force

SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.5, -2.5, 3.0, -3.0, 7.0, -7.0, 0.1, 1e300,
           -1e-300, 5e-324, np.inf, -np.inf, np.nan]
FLOATS = (np.float64, np.float32)
INTS = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)


def pairs(values, dtype):
    """Every (a, b) of ``values``, as two arrays of ``dtype`` (float32 rounds 1e300 to
    inf and 5e-324 to 0)."""
    with np.errstate(over="ignore"):
        a, b = np.array(list(itertools.product(values, values)), dtype=dtype).T
    return np.ascontiguousarray(a), np.ascontiguousarray(b)


def specials(dtype):
    with np.errstate(over="ignore"):
        return np.array(SPECIAL, dtype=dtype)


def assert_same(got, want, what):
    """Equal element by element: the same dtype, the same signs of zeros, NaN for NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, NumPy {want.dtype}"
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    same = ((got == want) & (np.signbit(got) == np.signbit(want))) | \
        (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: {np.argwhere(~same).ravel()[:8]}: got {got[~same][:8]}, " \
                       f"NumPy {want[~same][:8]}"


def assert_close_ulps(got, want, ulps, what):
    """Within ``ulps`` units in the last place, the same sign (zeros included) and the
    same NaNs and infinities."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, what
    assert (np.isnan(got) == np.isnan(want)).all(), what
    finite = np.isfinite(want)
    assert (got[~finite & ~np.isnan(want)] == want[~finite & ~np.isnan(want)]).all(), what
    assert (np.signbit(got[~np.isnan(want)]) == np.signbit(want[~np.isnan(want)])).all(), what
    error = np.abs(got[finite].astype(np.float64) - want[finite])
    allowed = ulps * np.spacing(np.abs(want[finite])).astype(np.float64)
    assert (error <= allowed).all(), f"{what}: off by {np.max(error / allowed) * ulps} ulps"


# -- parsing ----------------------------------------------------------------------------
@pytest.mark.parametrize("source, python", [
    ("y := a // b * c", "(a // b) * c"),
    ("y := a * b % c", "(a * b) % c"),
    ("y := a + b // c", "a + (b // c)"),
    ("y := -a // b", "(-a) // b"),
    ("y := a ** 2 % b", "(a ** 2) % b"),
    ("y := a % b // c / d", "((a % b) // c) / d"),
])
def test_floor_division_and_modulo_bind_like_multiplication(source, python):
    values = {"a": -7.5, "b": 2.0, "c": 3.0, "d": 4.0}
    used = {name: value for name, value in values.items() if name in source}
    assert ef.ein(source, **used) == eval(python, {}, values)
    statement = parse(source)
    assert parse(format_statement(statement)) == statement   # printed and read back


def test_new_names_are_reserved_and_take_their_arguments():
    for source in ("sign[i] := x[i]", "y[i] := tan[i]", "y[atan2] := x[atan2]"):
        with pytest.raises(errors.EinfuseNameError, match="reserved"):
            ef.compile(source)
    for source, count in (("y[i] := sign(x[i], 1)", "1"), ("y[i] := atan2(x[i])", "2")):
        with pytest.raises(errors.EinfuseSyntaxError, match=f"takes {count} argument"):
            ef.compile(source)
    assert isinstance(parse("y[i] := x[i] % 2").rhs, Binary)


# -- values against NumPy, on every backend ---------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op, numpy_op", [("//", np.floor_divide), ("%", np.mod)])
def test_float_floor_division_and_modulo_match_numpy_exactly(backend, dtype, op, numpy_op):
    a, b = pairs(SPECIAL, dtype)
    with np.errstate(all="ignore"):
        want = numpy_op(a, b)
    assert_same(ef.ein(f"y[i] := a[i] {op} b[i]", a=a, b=b, backend=backend), want,
                f"{op} {dtype.__name__}")
    rng = np.random.default_rng(5)   # wide exponents: huge and tiny quotients
    a = (rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500)).astype(dtype)
    b = (rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500)).astype(dtype)
    b[::9] = np.round(b[::9])
    with np.errstate(all="ignore"):
        want = numpy_op(a, b)
    assert_same(ef.ein(f"y[i] := a[i] {op} b[i]", a=a, b=b, backend=backend), want,
                f"{op} {dtype.__name__} random")


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op, numpy_op", [("//", np.floor_divide), ("%", np.mod)])
def test_integer_floor_division_and_modulo_match_numpy(backend, dtype, op, numpy_op):
    info = np.iinfo(dtype)
    values = sorted({info.min, info.min + 1, info.max, 0, 1, 2, 3, 7} |
                    ({-1, -2, -3, -7} if info.min < 0 else set()))
    a, b = pairs(values, dtype)
    with np.errstate(all="ignore"):   # x // 0 = x % 0 = 0, MIN // -1 wraps to MIN
        want = numpy_op(a, b)
    got = ef.ein(f"y[i] := a[i] {op} b[i]", a=a, b=b, backend=backend)
    assert_same(got, want, f"{op} {dtype.__name__}")


@pytest.mark.parametrize("op, numpy_op", [("//", np.floor_divide), ("%", np.mod)])
def test_integer_operators_with_literals_parameters_and_index_values(backend, op, numpy_op):
    x = np.array([-9, -4, -1, 0, 1, 5, 8], dtype=np.int32)
    with np.errstate(all="ignore"):
        for divisor in (3, -3, 0):
            got = ef.ein(f"y[i] := x[i] {op} d", x=x, d=divisor, backend=backend)
            assert_same(got, numpy_op(x, np.int32(divisor)), f"x {op} {divisor}")
            got = ef.ein(f"y[i] := x[i] {op} {divisor}", x=x, backend=backend)
            assert_same(got, numpy_op(x, np.int32(divisor)), f"x {op} literal {divisor}")
    i = np.arange(-5, 6)
    got = ef.ein(f"r[i] := i {op} 4 + 100 {op} (i - 3)", ranges={"i": range(-5, 6)},
                 backend=backend)
    with np.errstate(all="ignore"):
        assert_same(got, numpy_op(i, 4) + numpy_op(100, i - 3), f"index values {op}")


@pytest.mark.parametrize("statement, arrays, want", [
    ("y[i] := n[i] // 2", {"n": np.array([-3, 5], np.int8)}, np.array([-2, 2], np.int8)),
    ("y[i] := n[i] % 2.5", {"n": np.array([-3, 5], np.int8)}, np.array([2.0, 0.0])),
    ("y[i] := n[i] // x[i]", {"n": np.array([-3, 5], np.int32),
                              "x": np.array([2.0, -0.0], np.float32)},
     np.array([-2.0, -np.inf])),
    ("y[i] := x[i] % n[i]", {"n": np.array([-3, 0], np.int16),
                             "x": np.array([2.0, 1.0], np.float32)},
     np.array([-1.0, np.nan], np.float32)),
    ("y[i] := m[i] // 2 + m[i] % 2", {"m": np.array([True, False])}, np.array([1, 0])),
    ("y[i] := sign(n[i])", {"n": np.array([-3, 0, 7], np.int16)}, np.array([-1, 0, 1],
                                                                           np.int16)),
    ("y[i] := sign(u[i])", {"u": np.array([0, 200], np.uint8)}, np.array([0, 1], np.uint8)),
    ("y[i] := tan(n[i]) + atan2(n[i], 1)", {"n": np.array([0, 1])},
     np.tan([0, 1]) + np.arctan2([0, 1], 1)),
])
def test_result_dtypes_follow_numpy(backend, statement, arrays, want):
    """ints stay ints through //, % and sign (as NumPy's ufuncs); a float operand, tan or
    atan2 gives floats; int32 with float32 is float64, as NumPy promotes them."""
    got = ef.ein(statement, backend=backend, **arrays)
    assert got.dtype == want.dtype, f"{statement}: {got.dtype}"
    np.testing.assert_allclose(got, want, rtol=1e-15)


@pytest.mark.parametrize("dtype", FLOATS)
def test_sign_matches_numpy(backend, dtype):
    x = specials(dtype)
    assert_same(ef.ein("y[i] := sign(x[i])", x=x, backend=backend), np.sign(x), "sign")


@pytest.mark.parametrize("dtype", FLOATS)
def test_tan_and_atan2_match_numpy(backend, dtype):
    x = specials(dtype)
    with np.errstate(all="ignore"):
        assert_close_ulps(ef.ein("y[i] := tan(x[i])", x=x, backend=backend), np.tan(x), 4,
                          f"tan {dtype.__name__}")
        a, b = pairs(SPECIAL, dtype)   # every quadrant, signed zeros and infinities
        assert_close_ulps(ef.ein("y[i] := atan2(a[i], b[i])", a=a, b=b, backend=backend),
                          np.arctan2(a, b), 4, f"atan2 {dtype.__name__}")
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(2000) * 10.0 ** rng.integers(-6, 6, 2000)).astype(dtype)
    b = (rng.standard_normal(2000) * 10.0 ** rng.integers(-6, 6, 2000)).astype(dtype)
    assert_close_ulps(ef.ein("y[i] := atan2(a[i], b[i])", a=a, b=b, backend=backend),
                      np.arctan2(a, b), 4, "atan2 random")
    assert_close_ulps(ef.ein("y[i] := tan(a[i])", a=a, backend=backend), np.tan(a), 4,
                      "tan random")


def test_inside_reductions_and_with_a_scalar_divisor(backend):
    rng = np.random.default_rng(7)
    X = np.round(rng.standard_normal((6, 40)) * 20, 1)
    got = ef.ein("s[i] := sum[j](X[i,j] // 3 + X[i,j] % d) + max[j](sign(X[i,j]) * "
                 "atan2(X[i,j], 2))", X=X, d=-2.5, backend=backend)
    want = (X // 3 + X % -2.5).sum(1) + (np.sign(X) * np.arctan2(X, 2)).max(1)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    N = rng.integers(-1000, 1000, (5, 30))
    got = ef.ein("s[i] := sum[j](N[i,j] // 7 - N[i,j] % 7 * sign(N[i,j]))", N=N,
                 backend=backend)
    assert_same(got, (N // 7 - N % 7 * np.sign(N)).sum(1), "integer sum")


def test_the_oracle_agrees(backend):
    x = np.array([-2.75, -1.0, -0.0, 0.3, 2.0, 5.5])
    y = np.array([0.5, -1.5, 2.0, -0.25, 3.0, 1.0])
    statement = "z[i] := x[i] // y[i] + x[i] % y[i] + sign(x[i]) * tan(y[i]) + atan2(x[i], y[i])"
    want = brute_force(statement, {"i": (0, 6)}, {"x": x, "y": y})
    np.testing.assert_allclose(ef.ein(statement, x=x, y=y, backend=backend), want,
                               rtol=1e-13)


# -- gradients -------------------------------------------------------------------------
def test_gradcheck_tan_and_atan2(backend):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(11)
    x = (torch.rand(8, dtype=torch.float64, generator=gen) * 2 - 1).requires_grad_()
    # every quadrant of atan2, away from the origin
    a = torch.tensor([1.5, -2.0, 0.7, -0.4, 3.0, -1.0], dtype=torch.float64,
                     requires_grad=True)
    b = torch.tensor([0.5, 1.5, -2.5, -0.8, -0.1, 0.05], dtype=torch.float64,
                     requires_grad=True)

    def run_tan(x):
        return ef.ein("y[i] := tan(x[i]) * x[i]", x=x, backend=backend)

    def run_atan2(a, b):
        return ef.ein("y[i] := atan2(a[i], b[i]) + atan2(b[i] * a[i], 2)", a=a, b=b,
                      backend=backend)
    assert torch.autograd.gradcheck(run_tan, (x,), eps=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(run_atan2, (a, b), eps=1e-6, atol=1e-6)
    s = ef.ein("s := atan2(a[i], b[i])", a=a, b=b, backend=backend)
    s.backward()
    torch.testing.assert_close(a.grad, b.detach() / (a.detach()**2 + b.detach()**2))
    torch.testing.assert_close(b.grad, -a.detach() / (a.detach()**2 + b.detach()**2))


def test_sign_floor_division_and_modulo_pass_no_gradient_beside_others(backend):
    """Where the input also reaches the result another way, the gradient is that way's:
    d(sign(x) * x) = sign(x), d(x // 2 + x) = 1."""
    torch = pytest.importorskip("torch")
    x = torch.tensor([-1.3, 0.4, 2.2, -0.6], dtype=torch.float64, requires_grad=True)
    ef.ein("s := sign(x[i]) * x[i] + x[i] // 2 + x[i]", x=x, backend=backend).backward()
    torch.testing.assert_close(x.grad, torch.sign(x.detach()) + 1)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    ef.ein("s := (x[i] % 1.5) * w[i]", x=x.detach(), w=w, backend=backend).backward()
    torch.testing.assert_close(w.grad, torch.remainder(x.detach(), 1.5))


@pytest.mark.parametrize("statement, culprit, marked", [
    ("y[i] := sign(x[i]) * w[i]", "through sign", "sign(x[i])"),
    ("y[i] := x[i] // 2 + w[i]", "through '//'", "x[i] // 2"),
    ("y[i] := w[i] * (3 % x[i])", "through '%'", "3 % x[i]"),
    ("y[i] := sum[j](x[i,j] // 2 + sign(x[i,j]) * w[j])", "through '//' and sign",
     "x[i,j] // 2"),
])
def test_a_gradient_only_through_them_is_an_error_naming_them(statement, culprit, marked):
    from carets import caret_text
    for error in (pytest.raises(errors.NoGradientError),):
        with error as info:
            derive(statement, "x")
    text = str(info.value)
    assert culprit in text and "x has no gradient" in text
    assert caret_text(info.value, statement) == marked
    with pytest.raises(errors.NoGradientError, match="x has no gradient"):
        tangent(statement, ["x"])                       # forward mode too
    assert derive(statement, "w")                       # w has one (or none quietly)


def test_torch_backward_through_sign_alone_is_the_error(backend):
    torch = pytest.importorskip("torch")
    x = torch.tensor([-1.0, 2.0], dtype=torch.float64, requires_grad=True)
    for statement, name in (("s := sign(x[i])", "sign"), ("s := x[i] // 3", "'//'"),
                            ("s := x[i] % 3", "'%'")):
        y = ef.ein(statement, x=x, backend=backend)
        with pytest.raises(errors.NoGradientError, match=f"through {name}"):
            y.backward()


def test_floor_keeps_its_quiet_zero_gradient():
    """floor and ceil (and comparisons) are not in the list: their zero gradient stays."""
    (grad,) = derive("y[i] := floor(x[i]) + (x[i] > 0)", "x")
    assert grad.text.endswith(":= 0.0")


def test_jax_gradients_and_the_error():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    a = jnp.asarray([1.5, -2.0, 0.7, -0.4])
    b = jnp.asarray([0.5, 1.5, -2.5, -0.8])

    def ours(a, b):
        return ef.ein("s := atan2(a[i], b[i]) * tan(b[i] / 4)", a=a, b=b)

    def reference(a, b):
        return jnp.sum(jnp.arctan2(a, b) * jnp.tan(b / 4))
    for g, w in zip(jax.grad(ours, argnums=(0, 1))(a, b),
                    jax.grad(reference, argnums=(0, 1))(a, b)):
        np.testing.assert_allclose(g, w, rtol=1e-5)
    _, jvp = jax.jvp(lambda a: ours(a, b), (a,), (jnp.ones(4),))
    np.testing.assert_allclose(jvp, jax.jvp(lambda a: reference(a, b), (a,),
                                            (jnp.ones(4),))[1], rtol=1e-5)
    with pytest.raises(errors.NoGradientError, match="through sign"):
        jax.grad(lambda a: ef.ein("s := sign(a[i]) * 2", a=a))(a)
