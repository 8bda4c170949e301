"""The C backend: IR and renderer units, the build cache, name safety, and the
semantics the generated C must share with the NumPy reference."""

import math
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

import einfuse as ef
from einfuse import ir
from einfuse.backends.c import backend as c_backend, build as c_build
from einfuse.backends.c.backend import CBackend
from einfuse.backends.c.render import render_c
from einfuse.backends.numpy.backend import NumpyExecutor
from einfuse.plan import plan_for

pytestmark = pytest.mark.skipif(c_build.find_compiler() is None,
                                reason="no C compiler with OpenMP")
rng = np.random.default_rng(7)


def bind(statement, **kwargs):
    options = {k: kwargs.pop(k) for k in ("ranges", "pad", "bounds", "fill", "dtype",
                                          "threads") if k in kwargs}
    return ef.compile(statement, backend="numpy", **options).bind(**kwargs)


def run_c(statement, **kwargs):
    return CBackend.run(bind(statement, **kwargs))


def run_numpy(statement, **kwargs):
    call = bind(statement, **kwargs)
    return NumpyExecutor.for_call(call).run()


def same(statement, rtol=1e-12, **kwargs):
    got, want = run_c(statement, **kwargs), run_numpy(statement, **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol, equal_nan=True)
    return got


def source_of(statement, **kwargs):
    call = bind(statement, **kwargs)
    layouts = c_backend._buffers_layout_only(call)
    plan = plan_for(call.spec, call.dtypes.working.name, call.options.pad is not None,
                    call.options.bounds, tuple(layouts), 16)
    return plan, render_c(plan.program)


# -- IR and renderer --------------------------------------------------------------------

def test_affine_arithmetic():
    a = ir.Affine.var("p0") + ir.Affine.var("lo0") + ir.Affine(const=2)
    assert (a.scale(3) + ir.Affine.var("p0", -3)).terms == (("lo0", 3),)
    assert a.scale(3).const == 6


def test_hand_built_program_renders_compiles_and_runs():
    # out[p] = sum_k x[p*s + k] over a (n0 x n1) array: one loop nest, one accumulator
    load = ir.Load(0, (ir.Subscript(ir.Affine.var("p0"), (), "none", "d0_0", "s0_0"),
                       ir.Subscript(ir.Affine.var("p1"), (), "none", "d0_1", None)))
    body = (ir.Loop("p0", ir.Affine.var("n0"), "parallel", (
        ir.DeclareAcc("a0", "sum"),
        ir.Loop("p1", ir.Affine.var("n1"), "reduction", (ir.Accumulate("a0", "sum", load),),
                simd=True, reductions=(("a0", "sum"),)),
        ir.Store(1, (ir.Affine.var("p0"),), (None,), ir.AccValue("a0", "sum")))),)
    kernel = ir.LoopNest("k0", (ir.Buffer("t0", "working"), ir.Buffer("t1", "working", True)),
                       ("n0", "n1", "d0_0", "d0_1", "s0_0"), 0, body)
    source = render_c(ir.LoopProgram("float64", (kernel,)))
    assert "#pragma omp parallel for" in source
    assert "#pragma omp simd reduction(+:a0)" in source
    assert "typedef double T;" in source
    lib = c_build.load(source)
    x = rng.standard_normal((5, 7))
    out = np.empty(5)
    func = lib.k0
    func.argtypes = c_backend.KERNEL_ARGTYPES
    import ctypes
    ptrs = (ctypes.c_void_p * 2)(x.ctypes.data, out.ctypes.data)
    ints = np.array([5, 7, 5, 7, 7], dtype=np.int64)
    zeros = np.zeros(2)
    func(ptrs, ints.ctypes.data, zeros.ctypes.data, ints.ctypes.data, zeros.ctypes.data, 1,
         ctypes.byref(ctypes.c_int32()))
    np.testing.assert_allclose(out, x.sum(1))


def test_renderer_rejects_non_identifiers():
    bad = ir.LoopNest("k0; system(\"rm\")", (), (), 0, ())
    with pytest.raises(ValueError):
        render_c(ir.LoopProgram("float64", (bad,)))


def test_user_names_and_literals_never_reach_the_compiler():
    x = rng.standard_normal((4, 6))
    plan, source = source_of("Zq_out[iQx] := sum[jQx](WeirdTensorQ[iQx, jQx] * 0.1) "
                             "+ alphaQ", WeirdTensorQ=x, alphaQ=2.0)
    for user in ("Zq_out", "iQx", "jQx", "WeirdTensorQ", "alphaQ"):
        assert user not in source
    assert (0.1).hex() in source and "0.1" not in source
    # every identifier in the kernel is generated or from the fixed prelude
    body = source[source.index("void einfuse_kernel"):]
    allowed = re.compile(r"([tpqa]\d+(_[ms])?|n\d+|lo\d+|[ds]\d+_\d+|l|l_|b\d+|nb|T|"
                         r"int64_t|int32_t|int|void|const|double|float|restrict|for|if|"
                         r"else|return|bufs|ints|dprm|iprm|fills|nthreads|err|padv|fillv|"
                         r"nth|omp_get_max_threads|pragma|omp|parallel|simd|reduction|"
                         r"collapse|schedule|static|num_threads|einfuse_kernel|ef_\w+|"
                         r"INFINITY|NAN|expf?|logf?|sqrtf?|__builtin_expect)\Z")
    for word in re.findall(r"0x[0-9a-f.]+p[+-]?\d+|\d\w*|[A-Za-z_]\w*", body):
        assert word[0].isdigit() or allowed.match(word), word


def test_plan_tiles_the_contiguous_output_index_for_dist():
    w, x = rng.standard_normal((8, 5)), rng.standard_normal((8, 6))
    plan, source = source_of("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x)
    assert plan.mode == "tiled" and plan.inner == "j" and plan.fast_math
    assert "omp parallel for" in source and "#pragma omp simd" in source
    assert "ef_sq(" in source   # x**2 as a multiplication
    lse, _ = source_of("z[i] := logsumexp[j](X[i,j])", X=x)
    assert lse.mode == "scalar" and not lse.fast_math


def test_plans_are_shape_independent():
    a = bind("C[i,j] := A[i,k] * B[k,j]", A=np.ones((9, 10)), B=np.ones((10, 11)))
    b = bind("C[i,j] := A[i,k] * B[k,j]", A=np.ones((30, 40)), B=np.ones((40, 50)))
    la, lb = c_backend._buffers_layout_only(a), c_backend._buffers_layout_only(b)
    assert render_c(c_backend._plan(a, la).program) == render_c(c_backend._plan(b, lb).program)


def test_short_extents_are_not_spread_over_lanes():
    """The one specialisation on sizes: an index shorter than a vector is not tiled
    (the other output index, which the loads walk, is: the short one an outer loop)."""
    long = bind("D[i,j] := (w[k,i] - x[k,j])**2", w=np.ones((5, 20)), x=np.ones((5, 30)))
    short = bind("D[i,j] := (w[k,i] - x[k,j])**2", w=np.ones((5, 20)), x=np.ones((5, 3)))
    plans = [c_backend._plan(c, c_backend._buffers_layout_only(c)) for c in (long, short)]
    assert [p.inner for p in plans] == ["j", "i"]
    assert "j" not in plans[1].lane_indices
    np.testing.assert_allclose(
        ef.ein("D[i,j] := (w[k,i] - x[k,j])**2", w=np.arange(100.0).reshape(5, 20),
               x=np.arange(15.0).reshape(5, 3)),
        ((np.arange(100.0).reshape(5, 20)[:, :, None] -
          np.arange(15.0).reshape(5, 3)[:, None, :])**2).sum(0))


# -- build and cache ----------------------------------------------------------------------

def test_disk_cache_and_memory_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EINFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(c_backend, "_kernels", {})
    source = "/* cache test */ int einfuse_cache_test(void) { return 42; }\n"
    lib = c_build.load(source)
    assert lib.einfuse_cache_test() == 42
    files = [f for f in os.listdir(tmp_path) if f.endswith(".so")]
    assert len(files) == 1 and not [f for f in os.listdir(tmp_path) if "tmp" in f]
    assert c_build.load(source) is lib                   # loaded once per process
    c_build.clear_memory_cache()

    def no_compile(*args):
        raise AssertionError("compiled again although the disk cache holds the library")
    monkeypatch.setattr(c_build, "compile_library", no_compile)
    assert c_build.load(source).einfuse_cache_test() == 42
    other = c_build.library_key(source, c_build.flags_for(True))
    assert other != c_build.library_key(source, c_build.flags_for(False))


# (test_cache_faults.test_concurrent_builds_compile_each_kernel_once checks the same in
# the default run, counting the compiler's runs; this one uses the real compiler, which
# every child probes in its empty cache)
@pytest.mark.slow
def test_concurrent_processes_compile_the_same_kernel(tmp_path):
    script = ("import numpy as np, sys; sys.path.insert(0, %r)\n"
              "from einfuse.backends.c import build as c_build\n"
              "lib = c_build.load('int einfuse_race(void) { return 7; }\\n')\n"
              "assert lib.einfuse_race() == 7\n") % os.path.join(
                  os.path.dirname(__file__), "..", "src")
    env = dict(os.environ, EINFUSE_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env) for _ in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".so")]) == 1


def test_no_compiler_means_unavailable_and_auto_falls_back(monkeypatch):
    from einfuse.backends import _BACKENDS, get_backend
    monkeypatch.setattr(c_build, "_probed", True)
    monkeypatch.setattr(c_build, "_compiler", None)
    monkeypatch.setattr(c_backend, "_warned", [])
    monkeypatch.setitem(_BACKENDS, "c", CBackend)
    with pytest.warns(ef.EinfuseWarning, match="no C compiler"):
        assert get_backend("auto").name == "numpy"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert get_backend("auto").name == "numpy"      # one warning only
    with pytest.raises(ef.EinfuseError, match="C compiler"):
        run_c("y[i] := x[i]", x=np.ones(3))


# -- semantics against the reference -------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tiled_kernels_with_ragged_tails(dtype):
    for n, m, k in [(1, 1, 1), (3, 67, 5), (70, 129, 9)]:
        A = rng.standard_normal((n, k)).astype(dtype)
        B = rng.standard_normal((k, m)).astype(dtype)
        rtol = 1e-4 if dtype == np.float32 else 1e-12
        same("C[i,j] := A[i,k] * B[k,j]", rtol, A=A, B=B)
        same("D[i,j] := (w[k,i] - x[k,j])**2", rtol, w=A.T.copy(), x=B)
        same("P[i,j] := exp(A[i,j] - logsumexp[l](A[i,l]))", rtol, A=A)


def test_nan_and_inf_propagate_like_numpy():
    X = np.array([[1.0, np.nan, 3.0], [np.inf, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf]])
    for op in ("max", "min", "sum", "prod", "logsumexp"):
        same(f"z[i] := {op}[j](X[i,j])", X=X)
    y = np.array([np.nan, 1.0, -2.0])
    same("r[i] := max(y[i], 0.5) + min(0.5, y[i]) + relu(y[i])", y=y)
    same("r[i] := softplus(y[i]*800) + sigmoid(y[i]) + where(y[i] > 0, y[i], 2)", y=y)


def test_gathers_wrap_clip_fill_check_with_negative_values():
    W = rng.standard_normal((5, 3))
    idx = np.array([-7, -1, 0, 4, 5, 12], dtype=np.int32)
    for mode in ("clip", "wrap", "fill"):
        same("E[b,d] := W[idx[b] + 1, d]", W=W, idx=idx, bounds=mode, fill=-2.5)
    for mode in ("check", "promise"):
        with pytest.raises(ef.EinfuseError) as c_err:
            run_c("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds=mode)
        with pytest.raises(ef.EinfuseError) as np_err:
            run_numpy("E[b,d] := W[idx[b], d]", W=W, idx=idx, bounds=mode)
        assert str(c_err.value) == str(np_err.value)
    same("y[i] := W[p[q[i]], 0]", W=W, p=np.array([4, 0, 2]), q=np.array([2, 2, 0, 1]))


def test_pad_offset_ranges_index_values_and_strides():
    x = rng.standard_normal(40)[::-2]
    same("y[i] := x[i+a-2] * k[a]", x=x, k=np.arange(5.0), pad=0.5, ranges={"i": 20})
    same("y[i] := x[i] * i", x=x, ranges={"i": range(3, 11)})
    same("y[i] := x[i+1] - x[i]", x=x)
    A = np.asfortranarray(rng.standard_normal((9, 70)))[:, ::3]
    same("T[j,i] := A[i,j] * (j <= i)", A=A)
    same("s := sum[i,j](A[i,j] * A[i,j])", A=A)


def test_integer_and_bool_working_dtypes():
    a = rng.integers(-100, 100, size=(4, 70)).astype(np.int32)
    got = same("t[i] := sum[j](a[i,j] * 3) - 1", a=a)
    assert got.dtype == np.int64      # a sum of int32 widens, as a.sum() does
    assert same("t[i] := a[i,0] * 3 - 1", a=a).dtype == np.int32   # no sum: its own
    same("m[i] := max[j](a[i,j]) + min[j](abs(a[i,j]))", a=a.astype(np.int64))
    same("c[i] := (a[i,j] > 0) & (a[i,j] < 50)", a=a)
    same("p[i] := pow(a[i,0], 3)", a=a.astype(np.int64))
    same("r[i] := b[i] * 2.5", b=np.array([True, False, True]))


def test_threads_option_and_large_parallel_result():
    w, x = rng.standard_normal((33, 300)), rng.standard_normal((33, 257))
    one = run_c("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x, threads=1)
    many = run_c("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x, threads=4)
    np.testing.assert_allclose(one, many, rtol=1e-12)
    np.testing.assert_allclose(one, ((w[:, :, None] - x[:, None, :]) ** 2).sum(0),
                               rtol=1e-10)


def test_strategy_describes_the_plan():
    call = bind("C[i,j] := (A[i,k] - B[k,j])**2", A=np.ones((9, 12)), B=np.ones((12, 10)))
    text = CBackend.strategy(call)
    assert "OpenMP" in text and "register blocks of" in text and "i x j" in text
    # a sum of a few terms runs in lane tiles, without a register block of rows
    call = bind("C[i,j] := (A[i,k] - B[k,j])**2", A=np.ones((9, 4)), B=np.ones((4, 10)))
    text = CBackend.strategy(call)
    assert "tiled by" in text and "register blocks of" not in text


def test_erf_and_math_functions_match():
    x = np.linspace(-3, 3, 11)
    for func in ("exp", "expm1", "sin", "cos", "tanh", "erf", "floor", "ceil"):
        same(f"r[i] := {func}(x[i])", x=x)
    same("r[i] := log(y[i]) + log1p(y[i]) + sqrt(y[i])", y=x * x + 0.1)
    assert math.isclose(float(run_c("s := sum[i](x[i] ** 2)", x=x)), float((x ** 2).sum()))
