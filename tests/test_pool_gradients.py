"""Pooling forward and backward on the C backend (issue 11): strided windows run as
lane tiles (plan/lower.py), the gradient's scatter as one strided C add
(backends/c/strided_add.py).  Checked against torch's max_pool1d/2d/3d (ties
included: the first maximum in row-major window order gets the gradient), against
the NumPy reference backend bit for bit, and against the brute-force oracle."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.backends.c.strided_add import MIN_ELEMENTS, merged_axes, strided_add

from oracle import brute_force

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")
F = torch.nn.functional


def _tied(rng, shape, dtype=np.float32):
    """Few distinct values, so that most windows hold ties."""
    return rng.integers(-3, 3, shape).astype(dtype) * dtype(0.5)


def _run(statement, x, seed, backend, **options):
    xt = torch.tensor(x, requires_grad=True)
    y = ef.ein(statement, x=xt, backend=backend, **options)
    (g,) = torch.autograd.grad(y, xt, torch.tensor(seed))
    return y.detach().numpy(), g.numpy()


def _torch(pool, x, seed):
    xt = torch.tensor(x, requires_grad=True)
    y = pool(xt)
    (g,) = torch.autograd.grad(y, xt, torch.tensor(seed))
    return y.detach().numpy(), g.numpy()


POOLS = [
    # 2x2, stride 2: the bench case (large enough for the C strided add)
    ("o[c,i,j] := max[a,b](x[c, 2*i+a, 2*j+b])", (4, 64, 66), {"a": 2, "b": 2},
     lambda x: F.max_pool2d(x[None], 2)[0]),
    # 1-D, window 3, stride 3
    ("o[c,i] := max[a](x[c, 3*i+a])", (15, 100), {"a": 3},
     lambda x: F.max_pool1d(x, 3)),
    # 3-D, 2x2x2
    ("o[c,i,j,k] := max[a,b,d](x[c, 2*i+a, 2*j+b, 2*k+d])", (2, 8, 10, 36),
     {"a": 2, "b": 2, "d": 2}, lambda x: F.max_pool3d(x[None], 2)[0]),
    # overlapping windows, 3x3 stride 2: the gradient's positions collide (np.add.at)
    ("o[c,i,j] := max[a,b](x[c, 2*i+a, 2*j+b])", (3, 11, 41), {"a": 3, "b": 3},
     lambda x: F.max_pool2d(x[None], 3, stride=2)[0]),
    # min-pooling, window 2 stride 3 (gaps between windows)
    ("o[c,i,j] := min[a,b](x[c, 3*i+a, 3*j+b])", (3, 9, 48), {"a": 2, "b": 2},
     lambda x: -F.max_pool2d(-x[None], 2, stride=3)[0]),
]


@pytest.mark.parametrize("statement, shape, window, pool", POOLS)
def test_pooling_gradient_matches_torch_and_the_numpy_reference(statement, shape, window,
                                                                pool):
    rng = np.random.default_rng(7)
    x = _tied(rng, shape)
    ranges = {name: range(n) for name, n in window.items()}
    seed = _seed(np.random.default_rng(1), statement, x, ranges)
    y, g = _run(statement, x, seed, "c", ranges=ranges)
    ty, tg = _torch(pool, x, seed)
    np.testing.assert_array_equal(y, ty)
    np.testing.assert_array_equal(g, tg)
    ry, rg = _run(statement, x, seed, "numpy", ranges=ranges)
    assert y.tobytes() == ry.tobytes() and g.tobytes() == rg.tobytes()


def _seed(rng, statement, x, ranges):
    shape = ef.ein(statement, x=x, ranges=ranges, backend="numpy").shape
    return rng.standard_normal(shape).astype(x.dtype)


def test_nan_windows_give_no_gradient_and_others_match_torch():
    """A window holding a NaN has a NaN maximum that no element equals: none of its
    elements gets a gradient (torch sends it to the NaN); every other window is
    torch's, in float32 through the C strided add and in float64."""
    statement = "o[c,i,j] := max[a,b](x[c, 2*i+a, 2*j+b])"
    ranges = {"a": range(2), "b": range(2)}
    for dtype in (np.float32, np.float64):
        rng = np.random.default_rng(3)
        x = _tied(rng, (4, 64, 64), dtype)
        x[0, 0, 1] = x[1, 5, 6] = x[3, 63, 63] = np.nan
        seed = _seed(rng, statement, x, ranges)
        y, g = _run(statement, x, seed, "c", ranges=ranges)
        ty, tg = _torch(lambda t: F.max_pool2d(t[None], 2)[0], x, seed)
        np.testing.assert_array_equal(y, ty)     # NaN where torch has NaN
        nan_windows = np.isnan(ty).repeat(2, 1).repeat(2, 2)
        assert (g[nan_windows] == 0).all()
        np.testing.assert_array_equal(g[~nan_windows], tg[~nan_windows])
        ry, rg = _run(statement, x, seed, "numpy", ranges=ranges)
        assert g.tobytes() == rg.tobytes()


def test_hoisted_pool_gradient_statement_matches_brute_force():
    """The derived statement itself (first maximum per window, in the temporaries of
    rewrite/hoist.py), on the C backend's lane tiles, against the oracle."""
    (g,) = ef.derive("o[c,i,j] := min[a,b](x[c, 2*i+a, 2*j+b])", wrt="x",
                     options={"ranges": {"a": range(2), "b": range(2)}})
    rng = np.random.default_rng(5)
    x = _tied(rng, (2, 6, 40), np.float64)
    x[1, 2, 7] = np.nan
    do = rng.standard_normal((2, 3, 20))
    ranges = {n: range(2) for n in ("a", "b", "a2", "b2", "a3", "b3", "a4", "b4")}
    ranges.update(c=range(2), i=range(3), j=range(20))
    got = ef.ein(g.text, x=x, do=do, ranges=ranges, backend="c")
    spec_ranges = {n: (r.start, r.stop) for n, r in ranges.items()}
    want = brute_force(g.text, spec_ranges, {"x": x, "do": do})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype, shape, steps", [
    # x[c, 3*i + a + 1, 2*j + b + 2]: axes (c, i, j, a, b), gaps between rows; an
    # innermost extent of 2 (compiled in)
    (np.float32, (6, 13, 64, 2, 2), (40 * 130, 3 * 130, 2, 130, 1)),
    (np.float64, (6, 13, 64, 2, 2), (40 * 130, 3 * 130, 2, 130, 1)),
    # x[c, 3*i + 1, j + 2]: an innermost extent of 120 (read at run time)
    (np.float32, (16, 13, 120), (40 * 130, 3 * 130, 1)),
])
def test_strided_add_is_numpys_add_on_the_view(dtype, shape, steps):
    rng = np.random.default_rng(0)
    target = rng.standard_normal((16, 40, 130)).astype(dtype)
    want = target.copy()
    offset = 130 + 2
    values = rng.standard_normal(shape).astype(dtype)
    assert values.size >= MIN_ELEMENTS
    view = np.lib.stride_tricks.as_strided(want.reshape(-1)[offset:], shape,
                                           [s * want.itemsize for s in steps])
    view += values
    assert strided_add(target, offset, shape, steps, values)
    assert target.tobytes() == want.tobytes()


def test_strided_add_declines_what_it_does_not_handle():
    target = np.zeros((64, 64, 8), dtype=np.float16)
    values = np.ones((64, 64, 8), dtype=np.float16)
    assert not strided_add(target, 0, values.shape, (512, 8, 1), values)
    small = np.zeros((4, 4))
    assert not strided_add(small, 0, (4, 4), (4, 1), np.ones((4, 4)))


def test_merged_axes_follow_the_targets_memory_order():
    # pooling's view (c, i, j, a, b) of x[64, 128, 128]: c and i merge, a comes
    # before j, and j and b stay apart (the values step 4 along j, 1 along b)
    axes = merged_axes((64, 64, 64, 2, 2), (16384, 256, 2, 128, 1), (16384, 256, 4, 2, 1))
    assert axes == [(4096, 256, 256), (2, 128, 2), (64, 2, 4), (2, 1, 1)]
    assert merged_axes((5,), (1,), (1,)) == [(1, 0, 0), (5, 1, 1)]
