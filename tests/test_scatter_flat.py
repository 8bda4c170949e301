"""A gradient's general scatter-add (a gather on a later axis, quasi-affine subscripts)
runs as a compiled loop (backends/c/scatter.scatter_flat), giving np.add.at's bits."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import scatter as c_scatter


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_scatter_flat_gives_np_add_at_bits(dtype, shape):
    rng = np.random.default_rng(len(shape))
    target = rng.standard_normal(shape).astype(dtype)
    expected = target.copy()
    positions = tuple(rng.integers(0, n, (40, 25)) for n in shape)     # collisions
    values = (rng.standard_normal((40, 25)) * 1e3).astype(dtype)
    np.add.at(expected, positions, values)
    assert c_scatter.scatter_flat(target, positions, values)
    np.testing.assert_array_equal(target, expected)


def test_scatter_flat_declines_what_np_add_at_must_do():
    target = np.zeros(4, np.float32)
    assert not c_scatter.scatter_flat(target, (np.array([1]),), np.ones(1))   # float64 values
    assert not c_scatter.scatter_flat(np.zeros(4, np.int64), (np.array([1]),),
                                      np.ones(1, np.int64))
    assert not c_scatter.scatter_flat(np.zeros((4, 4))[:, 0], (np.array([1]),), np.ones(1))


@pytest.mark.parametrize("statement,shapes,options", [
    ("E[b,d] := W[d, idx[b]]", {"W": (6, 9), "idx": (9, (11,))}, {}),
    ("y[i] := x[i // 2] * 3", {"x": (5,)}, {"ranges": {"i": range(10)}}),
    ("y[i,j] := x[i, j % 3] * x[i, j % 3]", {"x": (4, 3)}, {"ranges": {"j": range(7)}}),
])
def test_general_scatter_gradients_are_compiled_and_exact(monkeypatch, statement, shapes,
                                                          options):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    arrays = {}
    for name, shape in shapes.items():
        if len(shape) == 2 and isinstance(shape[1], tuple):
            arrays[name] = torch.as_tensor(rng.integers(0, shape[0], shape[1]))
        else:
            arrays[name] = torch.tensor(rng.standard_normal(shape), requires_grad=True)
    done = []
    real_flat = c_scatter.scatter_flat
    monkeypatch.setattr(c_scatter, "scatter_flat", lambda *a: done.append(real_flat(*a)) or done[-1])
    out = ef.ein(statement, backend="c", **options, **arrays)
    weights = torch.tensor(rng.standard_normal(tuple(out.shape)))
    out.backward(weights)
    assert done and all(done)      # every scatter-add compiled, none left to np.add.at
    ours = {n: t.grad.clone() for n, t in arrays.items() if t.dtype.is_floating_point}
    # torch's own indexing, forward and backward, as the oracle
    for t in ours:
        arrays[t].grad = None
    x = arrays
    if "W" in x:
        expected = x["W"][:, x["idx"]].T
    elif statement.startswith("y[i] :="):
        expected = x["x"][torch.arange(10) // 2] * 3
    else:
        column = x["x"][:, torch.arange(7) % 3]
        expected = column * column
    expected.backward(weights)
    for name, grad in ours.items():
        torch.testing.assert_close(grad, arrays[name].grad, rtol=1e-12, atol=1e-12)
