"""Scatter-adds of gradients that are one strided view of the target
(autodiff/strided_scatter.py), and max-pooling's first-maximum gradient hoisted per
pooling window: against torch's own gradients."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.runtime.strided_scatter import strided_view
from einfuse.lang.ast import IndexExpr

torch = pytest.importorskip("torch")


def _sub(*terms, constant=0):
    return IndexExpr(tuple(terms), (), constant)


@pytest.mark.parametrize("scatter, ranges, expected", [
    # dx[2i + a] for a in range(2): every position once
    ((_sub(("i", 2), ("a", 1)),), {"i": range(4), "a": range(2)}, ((4, 2), (2, 1), 0)),
    # stride 2, window 3: positions 2 and 2 collide
    ((_sub(("i", 2), ("a", 1)),), {"i": range(4), "a": range(3)}, None),
    # a broadcast index (j not scattered) collides with itself
    ((_sub(("i", 1)),), {"i": range(4), "j": range(3)}, None),
    # out of bounds: 2*3 + 1 + 2 = 9 >= 8
    ((_sub(("i", 2), ("a", 1), constant=2),), {"i": range(4), "a": range(2)}, None),
    # an offset start: x[i + 1] for i in range(3)
    ((_sub(("i", 1), constant=1),), {"i": range(3)}, ((3,), (1,), 1)),
])
def test_strided_view_only_for_collision_free_in_bounds_scatters(scatter, ranges, expected):
    assert strided_view((8,), (1,), scatter, tuple(ranges), ranges) == expected


def _check(statement, shapes, reference, **options):
    rng = np.random.default_rng(0)
    tensors = {n: torch.tensor(rng.standard_normal(s), dtype=torch.float64,
                               requires_grad=True) for n, s in shapes.items()}
    got = ef.ein(statement, **tensors, **options)
    seed = torch.tensor(rng.standard_normal(tuple(got.shape)))
    ours = torch.autograd.grad(got, list(tensors.values()), seed)
    twins = {n: t.detach().clone().requires_grad_(True) for n, t in tensors.items()}
    want = reference(**twins)
    torch.testing.assert_close(got, want)
    theirs = torch.autograd.grad(want, list(twins.values()), seed)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b)


def test_max_pool_gradient_matches_torch_including_ties():
    def pool(x):
        return torch.nn.functional.max_pool2d(x[None], 2)[0]
    _check("o[c,i,j] := max[a,b](x[c, 2*i+a, 2*j+b])", {"x": (3, 8, 10)}, pool,
           ranges={"a": range(2), "b": range(2)})
    # ties: torch and einfuse both send the gradient to the first maximum of a window
    x = torch.tensor([[[1.0, 1.0, 0.0, 2.0], [1.0, 0.5, 2.0, 2.0]]], dtype=torch.float64,
                     requires_grad=True)
    y = ef.ein("o[c,i,j] := max[a,b](x[c, 2*i+a, 2*j+b])", x=x,
               ranges={"a": range(2), "b": range(2)})
    (g,) = torch.autograd.grad(y.sum(), x)
    assert g.tolist() == [[[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]]


def test_max_pool_gradient_is_hoisted_per_window():
    g = ef.derive("o[c,i,j] := max[a,b](x[c, 2*i+a, 2*j+b])", wrt="x")[0]
    ranges = {name: range(2) for name in ("a", "b", "a2", "b2", "a3", "b3", "a4", "b4")}
    kernel = ef.compile(g.text, ranges={**ranges, "c": range(2), "i": range(3),
                                        "j": range(3)})
    form = kernel.hoisted_form
    assert form is not None and form.hoisted.index_valued
    assert len(form.hoisted.temporaries) >= 2


@pytest.mark.parametrize("stride, width", [(3, 3), (3, 2), (2, 3)])
def test_strided_convolution_input_gradient(stride, width):
    """stride >= width: one strided view; stride < width: windows overlap, np.add.at."""
    def conv(x, k):
        return torch.nn.functional.conv1d(x[None, None], k[None, None], stride=stride)[0, 0]
    _check(f"y[i] := sum[a](x[{stride}*i + a] * k[a])", {"x": (23,), "k": (width,)}, conv)
