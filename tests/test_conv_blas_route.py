"""Whose BLAS a torch caller's convolution runs on (backends/c/windowed.windowed_route):
NumPy's OpenBLAS where it runs on the calling thread alone on a CPU that is not Intel's
(one thread: no pool of torch's to share, and on a Zen 3 it ran these products faster
than torch's MKL), torch's where more threads may run, on Intel's CPUs, and, where
OpenBLAS runs its AVX-512 kernels, for the panel form and the products of long sums (a
weight gradient's: on a Zen 4 those kernels ran them slower than MKL) -- with torch's
values and gradients either way."""

from __future__ import annotations

import numpy as np
import pytest

import einfuse as ef
from einfuse.backends.c import build as c_build
from einfuse.backends.c import windowed

torch = pytest.importorskip("torch")
F = torch.nn.functional

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="no C compiler")

BLAS_EVENTS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::matmul")

CONVS = [
    ("y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 16, "j": 16}}, (3, 8, 32, 32), (16, 8, 3, 3),
     F.conv2d, dict(stride=2, padding=1)),
    ("y[b,o,i,j] := x[b,c,2*i+2*p-2,j+2*q-2] * w[o,c,p,q]",
     {"pad": 0, "ranges": {"i": 15, "j": 29}}, (2, 8, 29, 29), (16, 8, 3, 3),
     F.conv2d, dict(stride=(2, 1), padding=2, dilation=2)),
    ("y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]", {}, (4, 16, 201), (16, 16, 5),
     F.conv1d, dict(stride=2)),
    ("y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]", {"pad": 0, "ranges": {"i": 300}},
     (4, 16, 300), (32, 16, 3), F.conv1d, dict(padding=1)),
]


def _blas_calls(run):
    """The torch BLAS events ``run()`` makes."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    return [e.key for e in prof.key_averages() if e.key in BLAS_EVENTS]


def _threads(monkeypatch, count, vendor="AuthenticAMD", avx512_kernels=False):
    # (the route also asks the CPU's vendor and OpenBLAS's kernels: a test fixes them,
    # whatever host runs it)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", str(count))
    monkeypatch.setattr(windowed, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(windowed, "avx512_kernels", lambda: avx512_kernels)


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("statement, options, xshape, wshape, conv, args", CONVS)
def test_one_thread_torch_convs_run_on_numpy_blas_with_torch_values(
        statement, options, xshape, wshape, conv, args, dtype, monkeypatch):
    _threads(monkeypatch, 1)
    kind = getattr(torch, dtype)
    x = torch.randn(*xshape, dtype=kind, requires_grad=True)
    w = torch.randn(*wshape, dtype=kind, requires_grad=True)
    kernel = ef.compile(statement, backend="c", **options)
    want = conv(x, w, **args)
    seed = torch.randn_like(want)
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else {}
    for _ in range(2):      # the first call and the prepared repeat
        got = []
        assert _blas_calls(lambda: got.append(kernel(x=x, w=w))) == []
        torch.testing.assert_close(got[0], want, **tolerance)
        # (the gradients' values: a gradient that is a plain contraction before its
        # scatter keeps backends/c/blas.route_for's library)
        grads = torch.autograd.grad(got[0], (x, w), seed)
        for mine, theirs in zip(grads, torch.autograd.grad(want, (x, w), seed,
                                                           retain_graph=True)):
            torch.testing.assert_close(mine, theirs, **tolerance)
    text = ef.explain(statement, x=x.detach(), w=w.detach(), backend="c", **options)
    assert "numpy.matmul (OpenBLAS on this one thread" in str(text)


@needs_c
def test_more_threads_keep_torchs_blas(monkeypatch):
    _threads(monkeypatch, 2)
    statement, options, xshape, wshape, conv, args = CONVS[0]
    x = torch.randn(*xshape, requires_grad=True)
    w = torch.randn(*wshape)
    kernel = ef.compile(statement, backend="c", **options)
    got = []
    assert _blas_calls(lambda: got.append(kernel(x=x, w=w)))
    torch.testing.assert_close(got[0], conv(x, w, **args), rtol=1e-4, atol=1e-4)
    # OpenBLAS's own count decides where it is set
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    kernel = ef.compile(statement, backend="c", **options)
    assert _blas_calls(lambda: kernel(x=x, w=w))


@needs_c
def test_intel_keeps_torchs_blas_at_one_thread(monkeypatch):
    # MKL is tuned for Intel's cores (it ran these products about 1.7x faster than
    # OpenBLAS at one thread on an AVX-512 Xeon): there a torch caller keeps torch's
    _threads(monkeypatch, 1, vendor="GenuineIntel")
    statement, options, xshape, wshape, conv, args = CONVS[0]
    x, w = torch.randn(*xshape), torch.randn(*wshape)
    kernel = ef.compile(statement, backend="c", **options)
    got = []
    assert _blas_calls(lambda: got.append(kernel(x=x, w=w)))
    torch.testing.assert_close(got[0], conv(x, w, **args), rtol=1e-4, atol=1e-4)
    text = str(ef.explain(statement, x=x, w=w, backend="c", **options))
    assert "OpenBLAS on this one thread" not in text


@needs_c
@pytest.mark.parametrize("statement, options, xshape, wshape, conv, args", CONVS)
def test_openblas_avx512_kernels_on_amd_keep_short_sums(statement, options, xshape,
                                                        wshape, conv, args, monkeypatch):
    # OpenBLAS's AVX-512 kernels (a Zen 4's) ran im2col's forward products (a sum over
    # the channels and the window, shorter than the positions) faster than torch's MKL
    # and the weight gradient's long sums slower: a one-thread torch caller runs the
    # forward on OpenBLAS and the weight gradient on MKL, with torch's values and
    # gradients (the panel form on MKL: tests/test_conv_panels.py)
    _threads(monkeypatch, 1, avx512_kernels=True)
    # (one image more than the other tests: the kernels, their gradients' too, are kept
    # per process with each signature's runner, whose route those tests' hosts chose)
    xshape = (xshape[0] + 1,) + tuple(xshape[1:])
    x = torch.randn(*xshape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(*wshape, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile(statement, backend="c", **options)
    want = conv(x, w, **args)
    seed = torch.randn_like(want)
    for _ in range(2):      # the first call and the prepared repeat
        got = []
        assert _blas_calls(lambda: got.append(kernel(x=x, w=w))) == []
        torch.testing.assert_close(got[0], want)
        grads = []
        assert _blas_calls(lambda: grads.append(torch.autograd.grad(got[0], (w,), seed,
                                                                    retain_graph=True)))
        torch.testing.assert_close(grads[0][0], torch.autograd.grad(
            want, (w,), seed, retain_graph=True)[0])
        torch.testing.assert_close(torch.autograd.grad(got[0], (x,), seed)[0],
                                   torch.autograd.grad(want, (x,), seed,
                                                       retain_graph=True)[0])
    text = str(ef.explain(statement, x=x.detach(), w=w.detach(), backend="c", **options))
    assert "numpy.matmul (OpenBLAS on this one thread" in text


# CONVS[:3] at sizes gradcheck's finite differences can afford (each input element is
# perturbed twice): (statement, options, x's shape, w's shape)
SMALL_CONVS = [
    (CONVS[0][0], {"pad": 0, "ranges": {"i": 6, "j": 6}}, (2, 3, 12, 12), (4, 3, 3, 3)),
    (CONVS[1][0], {"pad": 0, "ranges": {"i": 6, "j": 11}}, (2, 3, 11, 11), (4, 3, 3, 3)),
    (CONVS[2][0], {}, (2, 3, 21), (4, 3, 5)),
]


@needs_c
@pytest.mark.parametrize("statement, options, xshape, wshape", SMALL_CONVS)
def test_one_thread_gradcheck(statement, options, xshape, wshape, monkeypatch):
    _threads(monkeypatch, 1)
    x = torch.randn(*xshape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(*wshape, dtype=torch.float64, requires_grad=True)
    kernel = ef.compile(statement, backend="c", **options)
    text = str(ef.explain(statement, x=x.detach(), w=w.detach(), backend="c", **options))
    assert "numpy.matmul (OpenBLAS on this one thread" in text     # (the route under test)
    assert torch.autograd.gradcheck(lambda a, b: kernel(x=a, w=b), (x, w))


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_thread_nan_and_infinities_where_torch_has_them(dtype, monkeypatch):
    _threads(monkeypatch, 1)
    statement, options, xshape, wshape, conv, args = CONVS[0]
    kind = getattr(torch, dtype)
    x, w = torch.randn(*xshape, dtype=kind), torch.randn(*wshape, dtype=kind)
    x[0, 2, 5, 7], x[1, 3, 0, 0], x[2, 1, 31, 30] = float("nan"), float("inf"), \
        -float("inf")
    got = ef.compile(statement, backend="c", **options)(x=x, w=w)
    want = conv(x, w, **args)
    assert np.array_equal(torch.isnan(got).numpy(), torch.isnan(want).numpy())
    assert np.array_equal(torch.isinf(got).numpy(), torch.isinf(want).numpy())
    finite = torch.isfinite(want)
    tolerance = dict(rtol=1e-4, atol=1e-4) if dtype == "float32" else {}
    torch.testing.assert_close(got[finite], want[finite], **tolerance)


@needs_c
def test_one_thread_pad_times_infinity_is_nan_without_numpy_warnings(monkeypatch):
    """A padded read times an infinite weight is NaN in the semantics (tests/oracle.py);
    on NumPy's BLAS a torch caller gets it as on torch's, with no NumPy warning."""
    import warnings
    from oracle import brute_force
    _threads(monkeypatch, 1)
    statement = CONVS[0][0]
    options = {"pad": 0, "ranges": {"i": 8, "j": 8}}
    x = torch.randn(2, 8, 16, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, 8, 3, 3, dtype=torch.float64)
    w[1, 2, 0, 0] = float("inf")
    kernel = ef.compile(statement, backend="c", **options)
    ranges = dict(kernel.bind(x=x.detach().numpy(), w=w.numpy()).bounds.range_map)
    want = brute_force(statement, ranges, {"x": x.detach().numpy(), "w": w.numpy()}, pad=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            got = kernel(x=x, w=w)
            torch.autograd.grad(got.sum(), (x,))
    got = got.detach().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(want).any()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-10, atol=1e-10)
