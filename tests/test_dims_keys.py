"""Named dimensions: a repeated materialisation is looked up by the root's structural
key (built with the nodes), so equal keys must mean equal programs -- the same array
read twice is not two arrays, equal parameters are one, and a reused subexpression is
the same as a rebuilt one.  Each case materialises a variant first, then another that
differs only where the key must tell them apart, and checks both against NumPy."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.errors import EinfuseNameError, ShapeError

rng = np.random.default_rng(3)
x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_one_array_twice_and_two_arrays(backend):
    i, j, k = ef.dims("i j k")

    def build(a, b):
        return (ef.wrap(a)[k, i] * ef.wrap(b)[k, j]).sum(k)
    for a, b in ((x, y), (x, x), (y, x), (y, y), (x, y)):
        np.testing.assert_allclose(build(a, b).order(i, j, backend=backend), a.T @ b)


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_arrays_shared_across_children(backend):
    i, k = ef.dims("i k")
    for a, b, c in ((x, y, x), (x, y, y), (x, x, y), (y, x, x), (x, y, x)):
        got = ((ef.wrap(a)[k, i] - ef.wrap(b)[k, i]) * ef.wrap(c)[k, i]).sum(k)
        np.testing.assert_allclose(got.order(i, backend=backend),
                                   ((a - b) * c).sum(0))


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_parameters_equal_and_different(backend):
    i, k = ef.dims("i k")
    for p, q in ((0.5, 0.25), (0.5, 0.5), (0.25, 0.5), (3.0, 3), (100, 100), (100, 200)):
        got = ((ef.wrap(x)[k, i] * p) + (ef.wrap(y)[k, i] * q)).sum(k)
        np.testing.assert_allclose(got.order(i, backend=backend), (x * p + y * q).sum(0))


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_reused_node_and_rebuilt_one(backend):
    i, k = ef.dims("i k")
    s = ef.wrap(x)[k, i] * 2.0
    shared = (s.softmax(k) * s).sum(k)
    rebuilt = ((ef.wrap(x)[k, i] * 2.0).softmax(k) * (ef.wrap(x)[k, i] * 2.0)).sum(k)
    other = ((ef.wrap(x)[k, i] * 2.0).softmax(k) * (ef.wrap(y)[k, i] * 2.0)).sum(k)
    e = np.exp(2 * x - (2 * x).max(0))
    want = (e / e.sum(0) * 2 * x).sum(0)
    np.testing.assert_allclose(shared.order(i, backend=backend), want)
    np.testing.assert_allclose(rebuilt.order(i, backend=backend), want)
    np.testing.assert_allclose(other.order(i, backend=backend), (e / e.sum(0) * 2 * y).sum(0))


def test_order_and_size_change_the_program():
    i, k = ef.dims("i k")
    d = ef.wrap(x)[k, i] * ef.wrap(y)[k, i]
    np.testing.assert_allclose(d.order(k, i), x * y)
    np.testing.assert_allclose(d.order(i, k), (x * y).T)
    j = ef.dims("j")
    v = ef.wrap(y)[k, i] + j        # j has no size: an error, then a size set later
    with pytest.raises(ef.EinfuseError):
        v.order(k, i, j)
    j.size = 2
    np.testing.assert_allclose(v.order(k, i, j), y[:, :, None] + np.arange(2))


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_gathers_by_other_index_arrays(backend):
    b, k = ef.dims("b k")
    table = np.arange(12.0).reshape(4, 3)
    first, second = np.array([0, 3, 1]), np.array([2, 2, 0])
    for idx in (first, second, first):
        got = ef.wrap(table)[ef.wrap(idx)[b], k] * ef.wrap(table)[ef.wrap(first)[b], k]
        np.testing.assert_allclose(got.order(b, k, backend=backend),
                                   table[idx] * table[first])


# -- what building remembers (frontends/named_checks.Records, the reads' and reductions'
# parts, masks of dimensions): never an array, and never a check ------------------------

def test_remembered_building_keeps_no_array_alive():
    import gc
    import weakref
    i, j, k = ef.dims("i j k")
    w, v = rng.standard_normal((3, 5)), rng.standard_normal((3, 4))
    for _ in range(2):          # the second build finds what the first remembered
        D = ef.where(i <= j, ((ef.wrap(w)[k, i] - ef.wrap(v)[k, j]) ** 2).sum(k), 0.0)
        np.testing.assert_allclose(D.order(i, j), np.triu(((w[:, :, None] - v[:, None, :]) ** 2)
                                                          .sum(0)))
    alive = weakref.ref(w), weakref.ref(v)
    del D, w, v
    gc.collect()
    assert [ref() for ref in alive] == [None, None]


def test_remembered_merges_still_check_sizes_and_objects():
    i, j, k = ef.dims("i j k")
    w = rng.standard_normal((3, 5))
    for _ in range(2):
        (ef.wrap(w)[k, i] * ef.wrap(w)[k, j]).sum(k).order(i, j)
    with pytest.raises(ShapeError, match="dimension k"):     # same line, other shapes
        for a in (w, rng.standard_normal((4, 5))):
            (ef.wrap(w)[k, i] * ef.wrap(a)[k, j]).sum(k)
    other_k = ef.Dim("k")
    with pytest.raises(EinfuseNameError, match="'k'"):
        for d in (k, other_k):
            (ef.wrap(w)[k, i] * ef.wrap(w)[d, j]).sum(k)
