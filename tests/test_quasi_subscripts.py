"""Quasi-affine subscripts: ``//`` and ``%`` by a positive integer constant inside
subscripts (``x[i // 4, i % 4]``), on every backend, against NumPy reshapes and the
brute-force oracle; ranges, pad=, ranges=, errors with carets, int64 limits, gradients."""

import warnings

import numpy as np
import pytest

import einfuse as ef
from einfuse import errors
from einfuse.lang import parse
from einfuse.lang.printer import format_statement
from carets import caret_text
from oracle import brute_force

rng = np.random.default_rng(7)


def run(statement, backend, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.EinfuseWarning)
        return ef.ein(statement, backend=backend, **kwargs)


# -- the notation ------------------------------------------------------------------------

ROUND_TRIPS = [
    "y[i] := x[i // 4, i % 4]",
    "y[i] := x[(2*i + a) // 3]",
    "y[i] := x[i // 4 + 1]",
    "y[i] := x[3*(i % 4)]",
    "y[i] := x[-(i % 4) + 3]",
    "y[i] := x[i // 3 - 2*(i % 3) + 4]",
    "y[i] := x[(i - 3) // 4]",
    "y[i] := x[(-i) % 5]",
    "y[i] := x[idx[i // 2]]",
    "y[i] := x[i + i // 4]",
]


@pytest.mark.parametrize("source", ROUND_TRIPS)
def test_quasi_subscripts_print_back_exactly(source):
    statement = parse(source)
    text = format_statement(statement)
    assert parse(text) == statement
    assert format_statement(parse(text)) == text


@pytest.mark.parametrize("written, same", [
    ("y[i] := x[7 // 2 + i]", "y[i] := x[i + 3]"),          # constants fold
    ("y[i] := x[(-7) % 3 + i]", "y[i] := x[i + 2]"),        # Python's modulo
    ("y[i] := x[i // 1]", "y[i] := x[i]"),                  # a divisor of 1 folds
    ("y[i,j] := x[i % 1 + j]", "y[i,j] := x[j]"),
    ("y[i] := x[i // (2*2)]", "y[i] := x[i // 4]"),          # a constant divisor
    ("y[i] := x[i // 4 - i // 4 + i]", "y[i] := x[i]"),     # like parts add up
    ("y[i] := x[2*(i % 3) + i % 3]", "y[i] := x[3*(i % 3)]"),
    ("y[i] := x[(1 + i) // 2]", "y[i] := x[(i + 1) // 2]"),
])
def test_quasi_subscripts_normalise(written, same):
    assert parse(written) == parse(same)


@pytest.mark.parametrize("source, marked, words", [
    ("y[i] := x[i // 0]", "0", ["divisor of '//'", "positive integer constant", "not 0"]),
    ("y[i] := x[i % -2]", "-2", ["divisor of '%'", "not -2"]),
    ("y[i] := x[i // 1.5]", "1.5", ["not the float 1.5"]),
    ("y[i] := x[i // n]", "n", ["not the index n", "index array"]),
    ("y[i] := x[i % idx[i]]", "idx[i]", ["not a gather"]),
    ("y[i] := x[idx[i] % 3]", "idx[i]", ["cannot take a gather", "index array"]),
    ("y[i] := x[idx[i] + i // 2]", "idx[i] + i // 2", ["cannot also read an index array"]),
    ("y[i] := x[(i // 2) % 3]", "i // 2", ["another '//' or '%'"]),
    ("y[i,j] := x[(i % 2) * (j % 2)]", "(i % 2) * (j % 2)", ["integer constant"]),
])
def test_bad_quasi_subscripts_are_syntax_errors_pointing_at_the_offender(source, marked,
                                                                        words):
    with pytest.raises(errors.EinfuseSyntaxError) as info:
        ef.compile(source)
    for word in words:
        assert word in str(info.value)
    assert caret_text(info.value, source) == marked


# -- reshapes against NumPy, on every backend ---------------------------------------------

@pytest.mark.parametrize("rows", [0, 1, 3, 7])
def test_flatten(rows, backend):
    x = rng.standard_normal((rows, 4))
    got = run("y[i] := x[i // 4, i % 4]", backend, x=x)
    np.testing.assert_array_equal(got, x.reshape(-1))


def test_unflatten(backend):
    y = rng.standard_normal(12)
    got = run("z[a, b] := y[4*a + b]", backend, y=y, ranges={"b": 4})
    np.testing.assert_array_equal(got, y.reshape(3, 4))
    x = rng.standard_normal((2, 6))     # (2, 6) -> (3, 4) through the flat position
    got = run("z[a, b] := x[(4*a + b) // 6, (4*a + b) % 6]", backend, x=x, ranges={"b": 4})
    np.testing.assert_array_equal(got, x.reshape(3, 4))


def test_einops_like_rearranges(backend):
    B, H, W, C = 2, 3, 4, 5
    x = rng.standard_normal((B, H, W, C))
    # b h w c -> b (h w) c
    got = run("y[b, p, c] := x[b, p // 4, p % 4, c]", backend, x=x)
    np.testing.assert_array_equal(got, x.reshape(B, H * W, C))
    # b h w c -> (b c) (h w): the transposed flattening
    got = run("y[q, p] := x[q // 5, p // 4, p % 4, q % 5]", backend, x=x)
    np.testing.assert_array_equal(got, x.transpose(0, 3, 1, 2).reshape(B * C, H * W))
    # depth-to-space (pixel shuffle, factor 2): (h, w, 4) -> (2h, 2w)
    d = rng.standard_normal((3, 4, 4))
    got = run("o[r, s] := d[r // 2, s // 2, 2*(r % 2) + s % 2]", backend, d=d)
    want = d.reshape(3, 4, 2, 2).transpose(0, 2, 1, 3).reshape(6, 8)
    np.testing.assert_array_equal(got, want)


def test_blocks_and_strides(backend):
    x = rng.standard_normal(12)
    # each block of 4 reversed
    got = run("y[i] := x[4*(i // 4) + 3 - i % 4]", backend, x=x, ranges={"i": 12})
    np.testing.assert_array_equal(got, x.reshape(3, 4)[:, ::-1].reshape(-1))
    # a 3x4 matrix stored flat, read transposed: i appears twice, so ranges= gives it
    got = run("y[i] := x[4*(i % 3) + i // 3]", backend, x=x, ranges={"i": 12})
    np.testing.assert_array_equal(got, x.reshape(3, 4).T.reshape(-1))
    # a (4, 6) matrix of 2x3 blocks with its block rows swapped, and its block columns
    m = rng.standard_normal((4, 6))
    got = run("t[i, j] := m[2*(1 - i // 2) + i % 2, 3*(1 - j // 3) + j % 3]", backend, m=m,
              ranges={"i": 4, "j": 6})
    np.testing.assert_array_equal(got, m.reshape(2, 2, 2, 3)[::-1, :, ::-1].reshape(4, 6))
    # upsampling by repetition, and a strided block sum (a reduction over the remainder)
    got = run("u[i] := x[i // 3]", backend, x=x)
    np.testing.assert_array_equal(got, np.repeat(x, 3))
    got = run("s[b] := sum[i](x[i] * (i // 4 == b))", backend, x=x, ranges={"b": 3})
    np.testing.assert_allclose(got, x.reshape(3, 4).sum(1), rtol=1e-12)
    got = run("s[r] := sum[q](x[4*q + r])", backend, x=x, ranges={"q": 3})
    np.testing.assert_allclose(got, x.reshape(3, 4).sum(0), rtol=1e-12)


def test_gathers_with_quasi_subscripts_of_their_own(backend):
    x = rng.standard_normal(5)
    idx = np.array([4, 0, 2])
    got = run("y[i] := x[idx[i // 2]]", backend, x=x, idx=idx)
    np.testing.assert_array_equal(got, x[np.repeat(idx, 2)])


# -- ranges -----------------------------------------------------------------------------

def test_a_floor_division_bounds_its_inner_expression(backend):
    x = np.arange(3.0)
    # 0 <= (i - 3) // 4 + 1 < 3  <=>  -4 <= i - 3 < 8: i in -1..10, inner values from -4
    call = ef.compile("y[i] := x[(i - 3) // 4 + 1]").bind(x=x)
    assert call.bounds.range_map["i"] == (-1, 11)
    got = run("y[i] := x[(i - 3) // 4 + 1]", backend, x=x)
    np.testing.assert_array_equal(got, x[(np.arange(-1, 11) - 3) // 4 + 1])
    # a negative coefficient inside, and one outside
    got = run("y[i] := x[(5 - i) // 2]", backend, x=x)
    values = np.arange(0, 6)
    np.testing.assert_array_equal(got, x[(5 - values) // 2])
    got = run("y[i] := x[2 - i // 3]", backend, x=x)
    np.testing.assert_array_equal(got, x[2 - np.arange(9) // 3])


def test_negative_inner_values_with_ranges_and_pad(backend):
    x = rng.standard_normal(4)
    i = np.arange(-5, 9)
    got = run("y[i] := x[(i - 3) // 4 + 1]", backend, x=x, ranges={"i": range(-5, 9)},
              pad=-7.0)
    pos = (i - 3) // 4 + 1
    want = np.where((pos >= 0) & (pos < 4), x[np.clip(pos, 0, 3)], -7.0)
    np.testing.assert_array_equal(got, want)
    got = run("y[i] := x[(i - 6) % 4]", backend, x=x, ranges={"i": range(-5, 9)})
    np.testing.assert_array_equal(got, x[(i - 6) % 4])


def test_modulo_under_pad_and_short_axes(backend):
    x = rng.standard_normal(3)
    got = run("y[i] := x[i % 4]", backend, x=x, ranges={"i": 9}, pad=0.5)
    want = np.array([x[v % 4] if v % 4 < 3 else 0.5 for v in range(9)])
    np.testing.assert_array_equal(got, want)
    # a range that keeps i % 8 inside x is fine without pad=
    got = run("y[i] := x[i % 8]", backend, x=x, ranges={"i": range(8, 11)})
    np.testing.assert_array_equal(got, x)


def test_an_index_used_only_under_modulo_needs_a_range():
    with pytest.raises(errors.RangeError) as info:
        ef.ein("y[i] := x[i % 4]", x=np.ones(4))
    assert "only under '%'" in str(info.value) and "ranges={'i': ...}" in str(info.value)
    assert caret_text(info.value, "y[i] := x[i % 4]") == "x[i % 4]"
    np.testing.assert_array_equal(ef.ein("y[i] := x[i % 4]", x=np.arange(4.0),
                                         ranges={"i": 6}), [0, 1, 2, 3, 0, 1])


def test_a_modulo_larger_than_its_axis_is_a_range_error(backend):
    source = "y[i] := x[i // 4, i % 4]"
    with pytest.raises(errors.RangeError) as info:
        run(source, backend, x=np.ones((2, 3)))
    assert "i % 4 reaches 3" in str(info.value) and "3 element(s) on axis 1" in str(info.value)
    assert caret_text(info.value, source) == "i % 4"


def test_output_shapes_bind_quasi_reads(backend):
    x = rng.standard_normal(3)
    y = np.zeros(6)
    run("y[i] = x[i // 2]", backend, x=x, y=y)
    np.testing.assert_array_equal(y, np.repeat(x, 2))
    with pytest.raises(errors.RangeError) as info:
        run("y[i] = x[i // 2]", backend, x=x, y=np.zeros(7))
    assert "reaches 3" in str(info.value)
    y = np.zeros(7)
    run("y[i] = x[i // 2]", backend, x=x, y=y, pad=0)
    np.testing.assert_array_equal(y, np.append(np.repeat(x, 2), 0))


def test_subscript_arithmetic_stays_in_int64(backend):
    big = 2**62
    source = f"y[i] := x[{big}*i // {big}]"
    # i in 0..1 keeps the inner part within int64; i = 2 would not
    np.testing.assert_array_equal(run(source, backend, x=np.arange(2.0)), [0.0, 1.0])
    for kwargs in ({"x": np.arange(3.0)}, {"x": np.arange(2.0), "ranges": {"i": 3}, "pad": 0}):
        with pytest.raises(errors.EinfuseOverflowError) as info:
            run(source, backend, **kwargs)
        assert "beyond int64" in str(info.value)
        assert caret_text(info.value, source) == f"{big}*i // {big}"
    # and nothing in between wraps: the largest inner values still divide exactly
    n = 2**62
    got = run("y[i] := x[(i + 4611686018427387900) // 4611686018427387904]", backend,
              x=np.array([1.0, 2.0]), ranges={"i": range(0, 8)})
    np.testing.assert_array_equal(got, [1, 1, 1, 1, 2, 2, 2, 2])
    assert n == 4611686018427387904


# -- against the brute-force oracle ----------------------------------------------------

ORACLE_CASES = [
    ("y[i] := x[(i - 3) // 4 + 1] * w[i % 3]", {"x": (3,), "w": (3,)}, {"i": (-1, 11)}, None),
    ("y[i, j] := sum[k](A[(i + k) // 2, j % 3] * B[k, (2*j + 1) % 5])",
     {"A": (4, 3), "B": (3, 5)}, {"i": (0, 5), "j": (0, 7), "k": (0, 3)}, None),
    ("m[b] := max[k](x[3*b + k // 2 - 1])", {"x": (10,)}, {"b": (0, 4), "k": (0, 4)}, 0.0),
    ("y[i] := x[-(i % 4) + i // 4] + x[3 - i % 4]", {"x": (4,)}, {"i": (-6, 9)}, -1.0),
]


@pytest.mark.parametrize("statement, shapes, ranges, pad", ORACLE_CASES)
def test_against_the_oracle(statement, shapes, ranges, pad, backend):
    arrays = {name: rng.standard_normal(shape) for name, shape in shapes.items()}
    want = brute_force(statement, ranges, arrays, pad=pad)
    got = run(statement, backend, **arrays, pad=pad,
              ranges={n: range(lo, hi) for n, (lo, hi) in ranges.items()})
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_inferred_ranges_agree_with_the_oracle(backend):
    x = rng.standard_normal((5, 3))
    statement = "y[i] := x[(2*i + 1) // 3, (i + 2) % 3]"
    bounds = ef.compile(statement).bind(x=x).bounds.range_map
    assert bounds["i"] == (0, 7)    # 0 <= 2*i + 1 < 15
    want = brute_force(statement, bounds, {"x": x})
    np.testing.assert_array_equal(run(statement, backend, x=x), want)


def test_hoisted_statements_keep_quasi_reads(backend):
    x = rng.standard_normal((3, 8))
    got = run("p[i, j] := exp(x[i, j]) / sum[k](exp(x[i, 4*(k // 4) + k % 4]))", backend,
              x=x, ranges={"k": 8})
    np.testing.assert_allclose(got, np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-12)


def test_explain_describes_quasi_reads():
    text = str(ef.explain("y[i] := x[i // 4, i % 4]", x=np.ones((3, 4)), backend="numpy"))
    assert "i // 4" in text and "0..11" in text


# -- gradients ------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def t(*shape):
    return torch.randn(shape, dtype=torch.float64).requires_grad_()


GRADIENT_CASES = [
    ("y[i] := x[i // 4, i % 4]", lambda: {"x": t(3, 4)}, {}),
    ("o[r, s] := d[r // 2, s // 2, 2*(r % 2) + s % 2]", lambda: {"d": t(2, 3, 4)}, {}),
    ("y[i] := x[i] * w[i % 4] + w[(i + 1) // 3]", lambda: {"x": t(9), "w": t(4)}, {}),
    ("y[i] := x[(i - 3) // 4 + 1] * x[i % 3]", lambda: {"x": t(3)},
     {"ranges": {"i": range(0, 10)}, "pad": 0}),
    ("s[b] := sum[k](exp(x[(4*b + k) // 3, k % 3]))", lambda: {"x": t(5, 3)},
     {"ranges": {"k": 4}}),
]


@pytest.mark.parametrize("statement, make, options", GRADIENT_CASES,
                         ids=[c[0] for c in GRADIENT_CASES])
def test_gradcheck(statement, make, options, backend):
    named = make()
    names = list(named)

    def call(*values):
        return ef.ein(statement, backend=backend, **dict(zip(names, values)), **options)
    assert torch.autograd.gradcheck(call, tuple(named.values()), eps=1e-6, atol=1e-5)


def test_the_gradient_of_a_flatten_is_the_unflatten():
    from einfuse.autodiff.derive import derive
    (g,) = derive("y[i] := x[i // 4, i % 4]", "x")
    assert g.kind == "scatter" and [str(s) for s in g.scatter] == ["i // 4", "i % 4"]
    x = t(3, 4)
    seed = torch.arange(12, dtype=torch.float64)
    ef.ein("y[i] := x[i // 4, i % 4]", x=x).backward(seed)
    np.testing.assert_array_equal(x.grad.numpy(), seed.numpy().reshape(3, 4))


def test_second_derivatives_through_quasi_reads():
    def call(x, w):
        return ef.ein("y[i] := x[i // 4, i % 4] ** 2 * w[i % 4]", x=x, w=w)
    assert torch.autograd.gradgradcheck(call, (t(3, 4), t(4)))


def test_jax_derivatives_through_quasi_subscripts():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    x = jnp.asarray(rng.standard_normal((3, 4)))
    w = jnp.asarray(rng.standard_normal(4))

    def loss(x):
        return jnp.sum(ef.ein("y[i] := x[i // 4, i % 4]", x=x) * jnp.arange(12.0))
    np.testing.assert_allclose(jax.grad(loss)(x), np.arange(12.0).reshape(3, 4))

    def f(x, w):
        return ef.ein("y[i] := x[i // 4, i % 4] ** 2 * w[i % 4]", x=x, w=w)
    _, tangent = jax.jvp(f, (x, w), (jnp.ones_like(x), jnp.zeros_like(w)))
    np.testing.assert_allclose(tangent, 2 * np.asarray(x).reshape(-1) * np.tile(w, 3),
                               rtol=1e-12)
    stacked = jax.vmap(lambda x: ef.ein("y[i] := x[i // 4, i % 4]", x=x))(jnp.stack([x, 2 * x]))
    np.testing.assert_array_equal(stacked, np.stack([x.reshape(-1), 2 * x.reshape(-1)]))
