"""A strided convolution's input gradient on torch tensors is a scatter: its values
``dy W`` added in at the windows by the C col2im.  A repeated backward adds them by
the col2im prepared once per layout (runtime/window_scatter.prepared_add): the same
kernel and arguments as the general path, so the same bits, pads and infinities
included, and the gradients torch's autograd gives."""

from __future__ import annotations

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.runtime import torch_prepared

from oracle import brute_force

torch = pytest.importorskip("torch")
F = torch.nn.functional

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

# (statement, options, x shape, w shape, torch's conv): values past the col2im
# kernel's smallest size (window_pack.MIN_ELEMENTS)
STRIDED = [
    ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 8, "j": 8}}, (2, 4, 16, 16), (4, 4, 3, 3),
     lambda x, w: F.conv2d(x, w, stride=2, padding=1)),
    ("y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]", {}, (2, 8, 130), (8, 8, 5),
     lambda x, w: F.conv1d(x, w, stride=2)),
    ("y[b,o,i] := x[b,c,3*i+p-2] * w[o,c,p]", {"pad": 0, "ranges": {"i": 67}},
     (2, 8, 200), (8, 8, 5), lambda x, w: F.conv1d(x, w, stride=3, padding=2)),
]


def _input_gradients(statement, options, x, w, seeds, prepared=True):
    """dx for each seed, every backward through one compiled kernel (the first
    prepares, the later ones repeat), and whether the prepared col2im added, each
    time; with ``prepared`` False the general path (numpy_scatter_add) adds."""
    kernel = ef.compile(statement, backend="c", **options)
    found, taken = [], []
    add = torch_prepared._add_prepared

    def counted(*args):
        done = prepared and add(*args)
        taken.append(done)
        return done
    torch_prepared._add_prepared = counted
    try:
        for seed in seeds:
            found.append(torch.autograd.grad(kernel(x=x, w=w), (x,), seed)[0])
    finally:
        torch_prepared._add_prepared = add
    return found, taken


def _same(a, b):
    """Equal bits where finite, and NaN and infinities at the same places."""
    a, b = a.numpy(), b.numpy()
    return np.array_equal(a, b, equal_nan=True)


@needs_c
@pytest.mark.parametrize("statement, options, xshape, wshape, conv", STRIDED)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_prepared_col2im_matches_torch_and_the_general_path(statement, options, xshape,
                                                             wshape, conv, dtype):
    kind = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(xshape, dtype=kind, generator=gen, requires_grad=True)
    w = torch.randn(wshape, dtype=kind, generator=gen)
    want = conv(x, w)
    seeds = [torch.randn(want.shape, dtype=kind, generator=gen) for _ in range(3)]
    found, taken = _input_gradients(statement, options, x, w, seeds)
    assert taken and all(taken[1:])          # the repeats took the prepared col2im
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else {}
    for seed, mine in zip(seeds, found):
        theirs = torch.autograd.grad(want, (x,), seed, retain_graph=True)[0]
        torch.testing.assert_close(mine, theirs, **tolerance)
    # the general path (numpy_scatter_add) for the same seeds: the same bits
    general, untaken = _input_gradients(statement, options, x, w, seeds, prepared=False)
    assert untaken and not any(untaken)
    assert all(_same(a, b) for a, b in zip(found, general))


@needs_c
def test_prepared_col2im_keeps_infinities_and_nan_where_the_oracle_has_them():
    """Infinities and a NaN in the incoming gradient reach the positions their windows
    cover, as the brute-force loops of the gradient's statements put them."""
    statement, options, xshape, wshape, _ = STRIDED[2]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(xshape, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(wshape, dtype=torch.float64, generator=gen)
    seeds = []
    for _ in range(3):
        seed = torch.randn(2, 8, 67, dtype=torch.float64, generator=gen)
        seed[0, 1, 0] = float("inf")
        seed[1, 2, 66] = float("-inf")
        seed[1, 5, 20] = float("nan")
        seeds.append(seed)
    found, taken = _input_gradients(statement, options, x, w, seeds)
    assert all(taken[1:])
    # dx[b, c, 3*i + p - 2] += dy[b, o, i] * w[o, c, p], reads outside x dropped
    for seed, mine in zip(seeds, found):
        dy, wn = seed.numpy(), w.numpy()
        want = np.zeros(xshape)
        values = brute_force("v[b,i,c,p] := dy[b,o,i] * w[o,c,p]",
                             {"b": (0, 2), "i": (0, 67), "c": (0, 8), "p": (0, 5),
                              "o": (0, 8)}, {"dy": dy, "w": wn})
        for b, i, c, p in np.ndindex(values.shape):
            if 0 <= 3 * i + p - 2 < xshape[2]:
                want[b, c, 3 * i + p - 2] += values[b, i, c, p]
        got = mine.numpy()
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(np.isinf(got), np.isinf(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-12, atol=1e-12)
