"""Column sums in a Triton row group (schedule/row_groups.py, backends/triton/rows.py):
``dg[j] := dy[i,j] * xhat[i,j]`` joins the row group of the statements before it, each
program adding its rows' partial sums and the last program to finish adding those, so
layernorm's and RMSNorm's backward is one launch (issue 36 item 2).  Values and
gradients against torch's own functions (an independent oracle) and the NumPy reference
backend, float64 and float32, on shapes whose rows are not a multiple of a program's
block (several programs, several blocks each under the interpreter), one row, widths
that are not powers of two."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.triton import backend as triton_backend, launch

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not triton_backend.available(),
                                reason="Triton is not installed")
DEVICE = torch.device("cpu" if triton_backend.interpreted() else "cuda")
EPS = 1e-5


def _layernorm(n, gain):
    tail = " * g[j] + b[j]" if gain else ""
    return (f"mu[i] := sum[j](X[i,j]) / {n}\n"
            f"v[i] := sum[j]((X[i,j] - mu[i])**2) / {n}\n"
            f"y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + {EPS}){tail}")


def _rmsnorm(n, gain):
    tail = " * g[j]" if gain else ""
    return (f"ms[i] := sum[j](X[i,j] * X[i,j]) / {n}\n"
            f"y[i,j] := X[i,j] / sqrt(ms[i] + {EPS}){tail}")


def _torch_layernorm(X, g=None, b=None):
    return torch.nn.functional.layer_norm(X, X.shape[1:], g, b, EPS)


def _torch_rmsnorm(X, g=None):
    y = X / torch.sqrt((X * X).mean(1, keepdim=True) + EPS)
    return y if g is None else y * g


PROGRAMS = {"layernorm": (_layernorm, _torch_layernorm, ("g", "b")),
            "rmsnorm": (_rmsnorm, _torch_rmsnorm, ("g",))}
# (rows, columns): one program's block of rows is 128 for 20 columns, 64 for 33, 4 for
# 700 (37 rows: ten blocks over the interpreter's four programs, the last block short)
SHAPES = [(9, 20), (1, 20), (37, 700), (130, 33)]


def _data(shape, gains, dtype, seed=3):
    rng = np.random.default_rng(seed)
    rows, columns = shape
    data = {"X": rng.standard_normal(shape) * 2 + 0.5,
            "seed": rng.standard_normal(shape)}
    data.update({n: rng.standard_normal(columns) for n in gains})
    return {n: torch.from_numpy(v).to(dtype) for n, v in data.items()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("gain", [True, False])
@pytest.mark.parametrize("case", list(PROGRAMS))
def test_backward_is_one_launch_and_matches_torch(case, gain, shape, dtype):
    text, reference, gains = PROGRAMS[case]
    gains = gains if gain else ()
    program = ef.compile(text(shape[1], gain), backend="triton")
    data = _data(shape, gains, dtype)
    seed = data.pop("seed")
    rtol, atol = (1e-9, 1e-11) if dtype == torch.float64 else (2e-4, 2e-5)
    for _ in range(2):           # the first call prepares, the second repeats
        ins = {n: v.clone().to(DEVICE).requires_grad_(True) for n, v in data.items()}
        got = program(**ins)
        with launch.observed() as backward:
            (got * seed.to(DEVICE)).sum().backward()
        assert [r.kernel for r in backward] == ["einfuse_rows"], (case, gain, shape)
        ref = {n: v.clone().double().requires_grad_(True) for n, v in data.items()}
        want = reference(**ref)
        (want * seed.double()).sum().backward()
        np.testing.assert_allclose(got.detach().cpu().double().numpy(),
                                   want.detach().numpy(), rtol=rtol, atol=atol)
        for name in data:
            assert ins[name].grad.dtype == dtype
            np.testing.assert_allclose(ins[name].grad.cpu().double().numpy(),
                                       ref[name].grad.numpy(), rtol=rtol,
                                       atol=atol * shape[0], err_msg=f"{case}: d{name}")


def test_gradients_of_the_gains_alone_are_one_launch():
    """X needs no gradient: the backward is the row statistics and the column sums."""
    data = _data((37, 700), ("g", "b"), torch.float64)
    seed = data.pop("seed")
    X = data.pop("X")
    ins = {n: v.clone().to(DEVICE).requires_grad_(True) for n, v in data.items()}
    got = ef.compile(_layernorm(700, True), backend="triton")(X=X.to(DEVICE), **ins)
    with launch.observed() as backward:
        (got * seed.to(DEVICE)).sum().backward()
    assert [r.kernel for r in backward] == ["einfuse_rows"]
    xhat = _torch_layernorm(X)
    np.testing.assert_allclose(ins["g"].grad.cpu().numpy(), (seed * xhat).sum(0).numpy(),
                               rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ins["b"].grad.cpu().numpy(), seed.sum(0).numpy(),
                               rtol=1e-10, atol=1e-10)


def test_column_sums_are_the_same_bits_on_every_call():
    """The partial sums are added in program order, not in the order programs finish."""
    data = _data((37, 700), ("g", "b"), torch.float32)
    seed = data.pop("seed").to(DEVICE)
    program = ef.compile(_layernorm(700, True), backend="triton")
    grads = []
    for _ in range(3):
        ins = {n: v.clone().to(DEVICE).requires_grad_(True) for n, v in data.items()}
        (program(**ins) * seed).sum().backward()
        grads.append([ins[n].grad.cpu() for n in ("g", "b")])
    for later in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], later))


COLUMN_PROGRAM = ("m[i] := max[j](X[i,j])\n"
                  "c[j] := sum[i](exp(X[i,j] - m[i]) * w[i])\n"
                  "y[i,j] := X[i,j] - m[i] + c[j]")


@pytest.mark.parametrize("backend", ["numpy", "c", "triton"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(37, 700), (1, 20), (0, 5), (130, 33)])
def test_a_program_with_a_column_sum_matches_the_oracle(backend, dtype, shape):
    """Forward, nothing recorded: ``m`` and ``c`` are one row group on Triton (``y``
    reads ``c``, known only once every program has added its part: it runs after);
    against brute-force loops; zero rows give zero sums."""
    rng = np.random.default_rng(4)
    rows, columns = shape
    X = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(rows).astype(dtype)
    m = X.astype(np.float64).max(1) if rows else np.zeros(0)
    c = np.zeros(columns)
    for i in range(rows):
        for j in range(columns):
            c[j] += np.exp(float(X[i, j]) - m[i]) * float(w[i])
    y = X.astype(np.float64) - m[:, None] + c[None, :]
    arrays = {"X": X, "w": w}
    if backend == "triton":
        arrays = {n: torch.from_numpy(v).to(DEVICE) for n, v in arrays.items()}
    program = ef.compile(COLUMN_PROGRAM, backend=backend, outputs=["c", "y"])
    with launch.observed() as seen:
        got_c, got_y = program(**arrays)
    if backend == "triton" and rows:     # the group (m, c), then y's own kernel
        assert [r.kernel for r in seen] == ["einfuse_rows", "einfuse_kernel"]
    tol = 1e-10 if dtype == np.float64 else 2e-4
    got_c, got_y = (np.asarray(v.cpu() if hasattr(v, "cpu") else v) for v in (got_c, got_y))
    assert got_c.dtype == dtype and got_c.shape == (columns,)
    np.testing.assert_allclose(got_c, c, rtol=tol, atol=tol * max(rows, 1))
    np.testing.assert_allclose(got_y, y, rtol=tol, atol=tol * max(rows, 1))
