"""Range inference for pooling and strided windows (issue 31, item 5).

A window index (``p`` in ``max[p](x[2*i + p])``) takes its extent from ``ranges=`` or
from an array it indexes plainly (a kernel ``k[p]``, a mask ``m[p, q]``); the output
index then gets the 'valid' range, the largest for which every read stays inside its
array, exactly as for ``x[i + a]``.  Where neither extent can be inferred the
RangeError says which one is missing.

Oracles: the expected ranges come from torch's output-size formula
``floor((n - d*(w-1) - 1) / s) + 1`` (written out here, not taken from einfuse), the
values from tests/oracle.py's brute force and from torch's pooling and convolution
functions, the gradients from torch's autograd and from finite differences of the
brute-force oracle.  Every check runs on every backend (numpy, c, triton under
TRITON_INTERPRET=1)."""

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import einfuse as ef
from einfuse import errors

from carets import caret_text
from oracle import brute_force

torch = pytest.importorskip("torch")
F = torch.nn.functional


def valid(n: int, stride: int = 1, window: int = 1, dilation: int = 1,
          offset: int = 0) -> Tuple[int, int]:
    """The range (lo, hi exclusive) of ``i`` in ``x[stride*i + dilation*p + offset]``,
    ``p`` in 0..window-1, ``len(x) == n``: every ``i`` whose reads all lie in 0..n-1.
    ``i`` starts at ``-(offset // stride)``, the first with ``stride*i + offset >= 0``; from
    there it is torch's count on ``x[offset % stride:]``."""
    lo = -(offset // stride)
    count = (n - offset % stride - dilation * (window - 1) - 1) // stride + 1
    return lo, lo + max(0, count)


@dataclass(frozen=True)
class Case:
    name: str
    statement: str
    arrays: Callable[[np.random.Generator], Dict[str, np.ndarray]]
    expected: Dict[str, Tuple[int, int]]     # every index's range, for the oracle
    reference: Callable                       # torch, on the arrays as tensors
    ranges: Dict[str, int] = field(default_factory=dict)   # passed to einfuse


def _normal(*shape):
    return lambda rng: rng.standard_normal(shape)


def _with(**makers):
    return lambda rng: {name: make(rng) for name, make in makers.items()}


def _pool2d_ranges(h, w, stride, window, dilation=(1, 1)):
    return {"b": (0, 2), "c": (0, 2),
            "i": valid(h, stride[0], window[0], dilation[0]),
            "j": valid(w, stride[1], window[1], dilation[1]),
            "p": (0, window[0]), "q": (0, window[1])}


CASES = [
    Case("max-pool 3x3 stride 2", "y[b,c,i,j] := max[p,q](x[b,c,2*i+p,2*j+q])",
         _with(x=_normal(2, 2, 9, 8)), _pool2d_ranges(9, 8, (2, 2), (3, 3)),
         lambda x: F.max_pool2d(x, 3, 2), {"p": 3, "q": 3}),
    Case("max-pool, window from a mask", "y[b,c,i,j] := max[p,q](where(m[p,q] > 0, "
         "x[b,c,2*i+p,2*j+q], -inf))",
         _with(x=_normal(2, 2, 9, 8), m=lambda rng: np.ones((3, 2))),
         _pool2d_ranges(9, 8, (2, 2), (3, 2)),
         lambda x, m: F.max_pool2d(x, (3, 2), 2) + 0 * m.sum()),
    Case("avg-pool 3x3 stride 2", "y[b,c,i,j] := sum[p,q](x[b,c,2*i+p,2*j+q]) / 9",
         _with(x=_normal(2, 2, 9, 8)), _pool2d_ranges(9, 8, (2, 2), (3, 3)),
         lambda x: F.avg_pool2d(x, 3, 2), {"p": 3, "q": 3}),
    Case("mean sugar, 2x3 window, stride (3, 2)",
         "y[b,c,i,j] := mean[p,q](x[b,c,3*i+p,2*j+q])",
         _with(x=_normal(2, 2, 10, 9)), _pool2d_ranges(10, 9, (3, 2), (2, 3)),
         lambda x: F.avg_pool2d(x, (2, 3), (3, 2)), {"p": 2, "q": 3}),
    Case("dilated max-pool", "y[b,c,i,j] := max[p,q](x[b,c,2*i+2*p,j+q])",
         _with(x=_normal(2, 2, 11, 7)), _pool2d_ranges(11, 7, (2, 1), (2, 3), (2, 1)),
         lambda x: F.max_pool2d(x, (2, 3), (2, 1), dilation=(2, 1)), {"p": 2, "q": 3}),
    Case("conv2d stride 2, window from the kernel",
         "y[b,o,i,j] := sum[c,p,q](x[b,c,2*i+p,2*j+q] * w[o,c,p,q])",
         _with(x=_normal(2, 2, 9, 8), w=_normal(3, 2, 3, 2)),
         dict(_pool2d_ranges(9, 8, (2, 2), (3, 2)), o=(0, 3)),
         lambda x, w: F.conv2d(x, w, stride=2)),
    Case("conv1d stride 2", "y[b,o,i] := sum[c,a](x[b,c,2*i+a] * w[o,c,a])",
         _with(x=_normal(2, 3, 12), w=_normal(4, 3, 3)),
         {"b": (0, 2), "o": (0, 4), "c": (0, 3), "a": (0, 3), "i": valid(12, 2, 3)},
         lambda x, w: F.conv1d(x, w, stride=2)),
    Case("conv1d dilation 2", "y[b,o,i] := sum[c,a](x[b,c,i+2*a] * w[o,c,a])",
         _with(x=_normal(2, 3, 12), w=_normal(4, 3, 3)),
         {"b": (0, 2), "o": (0, 4), "c": (0, 3), "a": (0, 3), "i": valid(12, 1, 3, 2)},
         lambda x, w: F.conv1d(x, w, dilation=2)),
    Case("conv1d stride 3 dilation 2", "y[b,o,i] := sum[c,a](x[b,c,3*i+2*a] * w[o,c,a])",
         _with(x=_normal(2, 3, 14), w=_normal(4, 3, 2)),
         {"b": (0, 2), "o": (0, 4), "c": (0, 3), "a": (0, 2), "i": valid(14, 3, 2, 2)},
         lambda x, w: F.conv1d(x, w, stride=3, dilation=2)),
    # offset -1: i starts at 1 (its first read 2*1 - 1 = 0), as x[i + a - 1] does
    Case("max-pool with an offset", "y[b,c,i] := max[p](x[b,c,2*i+p-1])",
         _with(x=_normal(2, 2, 10)),
         {"b": (0, 2), "c": (0, 2), "p": (0, 3), "i": (1, 1 + valid(9, 2, 3)[1])},
         lambda x: F.max_pool1d(x[..., 1:], 3, 2), {"p": 3}),
    # the window read backwards: 2*i - p in 0..9 gives i in 1..4 (windows 0..2, 2..4, ...)
    Case("window subtracted", "y[b,c,i] := max[p](x[b,c,2*i-p])",
         _with(x=_normal(2, 2, 10)),
         {"b": (0, 2), "c": (0, 2), "p": (0, 3), "i": (1, 5)},
         lambda x: F.max_pool1d(x, 3, 2), {"p": 3}),
    # the whole subscript reversed: 9 - 2*i - p in 0..9 gives i in 0..3
    Case("reversed window", "y[b,c,i] := max[p](x[b,c,9-2*i-p])",
         _with(x=_normal(2, 2, 10)),
         {"b": (0, 2), "c": (0, 2), "p": (0, 3), "i": (0, 4)},
         lambda x: F.max_pool1d(x.flip(-1), 3, 2), {"p": 3}),
]


def _oracle(case, arrays):
    return brute_force(case.statement, case.expected, arrays)


def _einfuse(case, tensors, backend):
    return ef.ein(case.statement, backend=backend, ranges=case.ranges or None, **tensors)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_values_match_the_oracle_and_torch(case, backend):
    arrays = case.arrays(np.random.default_rng(0))
    got = _einfuse(case, arrays, backend)
    want = _oracle(case, arrays)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    theirs = case.reference(**{n: torch.tensor(a) for n, a in arrays.items()}).numpy()
    assert got.shape == theirs.shape
    np.testing.assert_allclose(got, theirs, rtol=1e-12, atol=1e-12)


# on the Triton interpreter, gradients of the cases whose kind (a max, a sum, a mean,
# a kernel, an offset, a reversed read) another case checks there too: the slow run's
# (their values above run there by default)
TRITON_GRADIENTS_SLOW = ("mean sugar, 2x3 window, stride (3, 2)", "dilated max-pool",
                         "conv2d stride 2, window from the kernel", "conv1d dilation 2",
                         "conv1d stride 3 dilation 2")


@pytest.mark.parametrize("case", [
    pytest.param(c, id=c.name, marks=[pytest.mark.slow_on("triton")]
                 if c.name in TRITON_GRADIENTS_SLOW else []) for c in CASES])
def test_gradients_match_torch(case, backend):
    """The backward statements bind with the forward's ranges (window from ranges= or
    from the kernel, output from 'valid') on every backend."""
    rng = np.random.default_rng(1)
    arrays = case.arrays(rng)
    mine = {n: torch.tensor(a, requires_grad=True) for n, a in arrays.items()}
    theirs = {n: torch.tensor(a, requires_grad=True) for n, a in arrays.items()}
    y = _einfuse(case, mine, backend)
    want = case.reference(**theirs)
    seed = torch.tensor(rng.standard_normal(tuple(want.shape)))
    got = torch.autograd.grad(y, list(mine.values()), seed, allow_unused=True)
    expected = torch.autograd.grad(want, list(theirs.values()), seed, allow_unused=True)
    for name, g, e in zip(mine, got, expected):
        if e is None:      # the mask: torch has no gradient for it, einfuse gives zeros
            assert g is None or not g.any(), name
            continue
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)


# -- 1-D: stride, dilation, window and offset at random -------------------------------

def _finite_difference_gradient(statement, ranges, arrays, seed, name):
    """d(sum(seed * y)) / d arrays[name] by central differences of the brute-force
    oracle: exact for a sum of products, and for a maximum away from ties."""
    x = arrays[name]
    grad = np.zeros_like(x)
    step = 1e-3
    for pos in np.ndindex(x.shape):
        total = []
        for sign in (1, -1):
            moved = dict(arrays)
            moved[name] = x.copy()
            moved[name][pos] += sign * step
            total.append(float((seed * brute_force(statement, ranges, moved)).sum()))
        grad[pos] = (total[0] - total[1]) / (2 * step)
    return grad


windows_1d = st.tuples(st.sampled_from(["max", "conv"]), st.integers(1, 3),
                       st.integers(1, 3), st.integers(1, 4), st.integers(0, 2),
                       st.integers(-2, 10))   # x's length past the first window's end


def _settings(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@_settings(8)
@given(params=windows_1d)
def test_1d_windows_at_random(backend, params):
    check_1d_window(backend, params)


@pytest.mark.slow
@_settings(60)
@given(params=windows_1d)
def test_1d_windows_at_random_many(backend, params):
    check_1d_window(backend, params)


def check_1d_window(backend, params):
    """One 1-D window: shape from the formula, values against the oracle and torch,
    the gradient against finite differences of the oracle."""
    kind, stride, dilation, window, offset, extra = params
    n = max(1, offset + dilation * (window - 1) + 1 + extra)   # a few too short: empty
    sub = f"{stride}*i + {dilation}*a + {offset}"
    rng = np.random.default_rng(n * 100 + window)
    x = rng.permutation(n).astype(np.float64) + rng.uniform(0, 0.5, n)   # no ties
    if kind == "max":
        statement, arrays, ranges = f"y[i] := max[a](x[{sub}])", {"x": x}, {"a": window}
        reference = lambda t: F.max_pool1d(t[None, None], window, stride,
                                            dilation=dilation)[0, 0]
    else:
        k = rng.standard_normal(window)
        statement, arrays, ranges = f"y[i] := x[{sub}] * k[a]", {"x": x, "k": k}, {}
        reference = lambda t: F.conv1d(t[None, None], torch.tensor(k)[None, None],
                                       stride=stride, dilation=dilation)[0, 0]
    expected = {"i": valid(n, stride, window, dilation, offset), "a": (0, window)}
    xt = torch.tensor(x, requires_grad=True)
    tensors = {n: torch.tensor(a) for n, a in arrays.items()}
    y = ef.ein(statement, backend=backend, ranges=ranges or None, **dict(tensors, x=xt))
    lo, hi = expected["i"]
    assert tuple(y.shape) == (hi - lo,)
    if hi == lo:
        return
    np.testing.assert_allclose(y.detach().numpy(), brute_force(statement, expected, arrays),
                               rtol=1e-12, atol=1e-12)
    start = offset % stride     # the first read of the first output
    np.testing.assert_allclose(y.detach().numpy(),
                               reference(torch.tensor(x[start:])).numpy(),
                               rtol=1e-12, atol=1e-12)
    seed = rng.standard_normal(hi - lo)
    (g,) = torch.autograd.grad(y, xt, torch.tensor(seed))
    np.testing.assert_allclose(
        g.numpy(), _finite_difference_gradient(statement, expected, arrays, seed, "x"),
        rtol=1e-6, atol=1e-7)


# -- an index both strided and plain ---------------------------------------------------

@pytest.mark.parametrize("statement, arrays, expected", [
    # i plain in z (5) and strided in x (valid 0..3): the intersection, 0..3
    ("y[i] := sum[a](x[2*i+a] * k[a]) + z[i]",
     {"x": 10, "k": 3, "z": 5}, {"i": (0, 4), "a": (0, 3)}),
    # z shorter than the strided reads allow: z's 3
    ("y[i] := sum[a](x[2*i+a] * k[a]) + z[i]",
     {"x": 10, "k": 3, "z": 3}, {"i": (0, 3), "a": (0, 3)}),
    # one array, plain and strided: x[i] for i < 9, x[2*i + 1] for i <= 3
    ("y[i] := x[i] - x[2*i+1]", {"x": 9}, {"i": (0, 4)}),
    # in one access: the diagonal block's rows i, its columns 2*i + p
    ("y[i] := max[p](x[i, 2*i+p])", {"x": (6, 9)}, {"i": (0, 4), "p": (0, 2)}),
    # a max-pool minus its input's corner: i plain in x too
    ("y[c,i,j] := max[p,q](x[c,2*i+p,2*j+q]) - x[c,i,j]",
     {"x": (2, 7, 9)}, {"c": (0, 2), "i": (0, 3), "j": (0, 4), "p": (0, 2), "q": (0, 2)}),
])
def test_an_index_both_strided_and_plain(backend, statement, arrays, expected):
    rng = np.random.default_rng(2)
    arrays = {n: rng.standard_normal(s) for n, s in arrays.items()}
    window = {n: hi for n, (lo, hi) in expected.items() if n in ("p", "q")}
    got = ef.ein(statement, backend=backend, ranges=window or None, **arrays)
    want = brute_force(statement, expected, arrays)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_an_output_array_gives_the_largest_window_that_fits(backend):
    """With '=' the output's length binds i; the window index, with no other source,
    takes every value for which the reads fit (as ``a`` in ``y[i] = x[i + a]``)."""
    x = np.random.default_rng(3).standard_normal(9)
    y = np.full(4, np.nan)
    ef.ein("y[i] = max[p](x[2*i+p])", x=x, y=y, backend=backend)
    np.testing.assert_array_equal(y, brute_force("y[i] := max[p](x[2*i+p])",
                                                 {"i": (0, 4), "p": (0, 3)}, {"x": x}))
    # i bound by a plain use instead: 2*2 + p <= 8 lets p run to 4
    z = np.zeros(3)
    got = ef.ein("y[i] := max[p](x[2*i+p]) + z[i]", x=x, z=z, backend=backend)
    np.testing.assert_array_equal(got, brute_force("y[i] := max[p](x[2*i+p]) + z[i]",
                                                   {"i": (0, 3), "p": (0, 5)},
                                                   {"x": x, "z": z}))


# -- the extent that is missing ---------------------------------------------------------

@pytest.mark.parametrize("statement, shapes, ranges, words, marked", [
    ("y[b,c,i,j] := max[p,q](x[b,c,2*i+p,2*j+q])", {"x": (1, 2, 9, 9)}, {},
     ["the window indices p and q have no range", "ties them to i and j",
      "ranges= for p and q", "ranges={'p': 3, 'q': 3}", "a window w[p, q]"],
     "x[b,c,2*i+p,2*j+q]"),
    # p given: q is the one missing, and only j waits for it
    ("y[b,c,i,j] := max[p,q](x[b,c,2*i+p,2*j+q])", {"x": (1, 2, 9, 9)}, {"p": 3},
     ["the window index q has no range", "ties it to j,", "ranges={'q': ...}"],
     "x[b,c,2*i+p,2*j+q]"),
    ("y[i] := sum[a](x[2*i+a])", {"x": (9,)}, {},
     ["the window index a has no range", "ranges={'a': ...}", "an array indexed by it"],
     "x[2*i+a]"),
    # an implicit sum's window, dilated
    ("y[i] := x[i+2*a]", {"x": (9,)}, {}, ["the window index a has no range"], "x[i+2*a]"),
    # under a floor division
    ("y[i] := max[p](x[(2*i+p)//2])", {"x": (9,)}, {}, ["the window index p has no range"],
     "x[(2*i+p)//2]"),
    # inside an index array: the gather's subscript ties p to i
    ("y[i] := max[p](x[idx[2*i+p]])", {"x": (5,), "idx": (9,)}, {},
     ["the window index p has no range", "idx[2*i + p] only ties it to i"], "idx[2*i+p]"),
    # no window: two output indices tied together
    ("y[i,j] := x[i+j]", {"x": (9,)}, {},
     ["indices i and j have no range", "ranges= for one of them", "ranges={'i': ...}"],
     "x[i+j]"),
])
def test_the_error_says_which_extent_is_missing(backend, statement, shapes, ranges, words,
                                                marked):
    arrays = {n: np.ones(s, dtype=np.int64 if n == "idx" else np.float64)
              for n, s in shapes.items()}
    with pytest.raises(errors.RangeError) as info:
        ef.ein(statement, backend=backend, ranges=ranges or None, **arrays)
    for word in words:
        assert word in str(info.value)
    assert caret_text(info.value, statement) == marked
    with pytest.raises(errors.RangeError) as again:      # explain says the same
        ef.explain(statement, shapes=shapes, ranges=ranges or None)
    assert str(again.value).split("\n")[0] == str(info.value).split("\n")[0]


def test_with_pad_both_the_window_and_the_output_are_named(backend):
    statement = "y[i] := max[p](x[2*i+p-1])"
    with pytest.raises(errors.RangeError) as info:
        ef.ein(statement, x=np.ones(9), pad=-math.inf, backend=backend)
    message = str(info.value)
    assert "indices i and p: their ranges cannot be inferred" in message
    assert "with pad= shifted subscripts do not limit ranges" in message
    assert "ranges={'i': ..., 'p': ...}" in message
    assert caret_text(info.value, statement) == "x[2*i+p-1]"
    # with both given, pad= gives the 'same' pooling torch computes with padding=1
    x = np.random.default_rng(4).standard_normal(9)
    got = ef.ein(statement, x=x, pad=-math.inf, ranges={"i": 5, "p": 3}, backend=backend)
    want = F.max_pool1d(torch.tensor(x)[None, None], 3, 2, padding=1)[0, 0].numpy()
    np.testing.assert_array_equal(got, want)


def test_a_failed_update_writes_nothing(backend):
    """'=' into an output too long for the strided reads: an error naming the access,
    and the output untouched."""
    y = np.full(5, 7.0)
    with pytest.raises(errors.RangeError, match=r"x\[2\*i \+ p\]"):
        ef.ein("y[i] = max[p](x[2*i+p])", x=np.ones(9), y=y, ranges={"p": 3},
               backend=backend)
    assert (y == 7.0).all()


def test_the_message_docs_notation_quotes_is_current():
    """docs/notation.md §6.6 quotes the max-pool message (wrapped: compared with the
    whitespace collapsed)."""
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "notation.md"), encoding="utf-8") as handle:
        docs = " ".join(handle.read().split())
    with pytest.raises(errors.RangeError) as info:
        ef.ein("y[b,c,i,j] := max[p,q](x[b,c,2*i+p,2*j+q])", x=np.ones((1, 1, 9, 9)))
    assert " ".join(f"RangeError: {info.value}".split()) in docs
