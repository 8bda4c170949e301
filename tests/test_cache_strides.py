"""Strides that alias in the cache (plan/blocking.aliases): a lane tile's strip walked by
a reduction at a multiple of 4096 bytes crowds into one cache set, so the C backend's
run copies such an input with its rows padded (plan/loop_plan._strip_pads,
backends/c/pack.pack_axis).  The copy keeps values and the unit-stride axis; the kernels
of either target agree with tests/oracle.py on padded inputs with partial row blocks
and lane tiles; inputs whose strips are walked once (a row kernel's rows) are left as
they are."""

import os
import subprocess
import sys

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis import machine as machine_module
from einfuse.backends.c import build as c_build
from einfuse.backends.c.pack import pack_axis
from einfuse.plan import blocking
from einfuse.plan.loop_plan import input_buffers, lane_packs
from einfuse.schedule.loop_choice import loop_choice
from einfuse.plan.arguments import unit_axis

from oracle import brute_force

needs_c = pytest.mark.skipif(c_build.find_compiler() is None, reason="builds C kernels")
DIST = "D[i,j] := (w[k,i] - x[k,j])**2"


def test_strides_a_multiple_of_the_set_span_alias():
    for stride in (4096, 8192, 2048, 1024, 3 * 4096):
        assert blocking.aliases(stride), stride
    # rows of 784 float32 (3136 bytes) or padded by one line reach every set
    for stride in (3136, 4160, 64, 4, 0, 256):
        assert not blocking.aliases(stride), stride
    assert blocking.padded_row(1024, 4) == 1040 and blocking.padded_row(512, 8) == 520
    assert blocking.padded_row(784, 4) == 784 and blocking.padded_row(3, 4) == 3
    assert not blocking.aliases(blocking.padded_row(1024, 4) * 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axis", [((300, 1024), 1), ((300, 1024), 0),
                                         ((3, 256, 512), 1), ((5, 7), 0), ((64, 2048), 1)])
def test_a_packed_copy_keeps_values_and_pads_aliasing_rows(dtype, shape, axis):
    array = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    packed = pack_axis(array, axis)
    np.testing.assert_array_equal(packed, array)
    assert packed.strides[axis] == packed.itemsize
    # the rows along ``axis`` (the next stride up) are padded; outer axes step whole
    # blocks of rows
    rows = min(stride for other, stride in enumerate(packed.strides) if other != axis)
    assert not blocking.aliases(rows), packed.strides


def _packs(statement, **arrays):
    call = ef.compile(statement, backend="c").bind(**arrays)
    buffers = input_buffers(call)
    out = np.empty(call.output_shape, call.dtypes.working)
    buffers.append(out)
    choice = loop_choice(call, [unit_axis(b) for b in buffers])
    return call, lane_packs(call, choice, buffers)


@needs_c
def test_a_strip_walked_by_the_reduction_at_an_aliasing_stride_is_padded():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 1000), dtype=np.float32)
    x = rng.standard_normal((96, 1024), dtype=np.float32)
    _, packs = _packs(DIST, w=w, x=x)
    assert (1, 1) in packs                      # x: its unit axis kept, rows padded
    _, packs = _packs(DIST, w=w, x=np.ascontiguousarray(x[:, :1000]))
    assert all(slot != 1 for slot, _ in packs)  # 4000-byte rows: nothing to pad
    # a row kernel reads each row once: no copy
    _, packs = _packs("y[i,j] := x[i,j] - sum[k](x[i,k])", x=x)
    assert packs == ()


@needs_c
def test_explain_names_the_padded_copy():
    def copied(width):
        report = ef.explain(DIST, backend="c", shapes={"w": (96, 1000), "x": (96, width)})
        # (w is copied too, transposed for the row block's reads along k)
        return "x (copied" in (report.schedule or "")
    assert copied(1024) and not copied(1000)


CHILD = """
import numpy as np, einfuse as ef
rng = np.random.default_rng(3)
# rows 1024 elements apart (4096 or 8192 bytes), 45 columns used: partial lane tiles;
# 23 rows of w: partial row blocks
res = {}
for dtype in (np.float32, np.float64):
    wide = rng.standard_normal((37, 1024)).astype(dtype)
    w = rng.standard_normal((37, 23)).astype(dtype)
    x = wide[:, 3:48]
    tag = np.dtype(dtype).name
    res["D_" + tag] = ef.ein("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x, backend="c")
    res["G_" + tag] = ef.ein("o[i] := sum[j](exp(-sum[k]((w[k,i] - x[k,j])**2) / 64) * x[0,j])",
                             w=w, x=x, backend="c")
    res["w_" + tag], res["x_" + tag] = w, x
np.savez(OUT, **res)
"""


@needs_c
# (each target a child process compiling its kernels cold; the native build is what every
# other test runs: the slow step builds it again here, the default run keeps the AVX2
# one, DEVELOPERS.md's target)
@pytest.mark.parametrize("target", [pytest.param("native", marks=pytest.mark.slow), "avx2"])
def test_padded_inputs_agree_with_the_oracle_on_either_target(target, tmp_path):
    if target == "avx2" and not {"avx2", "fma", "bmi2"} <= machine_module._cpu_flags():
        pytest.skip("the host cannot run avx2 code")
    out = tmp_path / "out.npz"
    env = dict(os.environ, EINFUSE_CPU=target)
    subprocess.run([sys.executable, "-c", f"OUT = {str(out)!r}\n" + CHILD], env=env,
                   check=True, timeout=600)
    got = np.load(out)
    ranges = {"i": (0, 23), "j": (0, 45), "k": (0, 37)}
    for tag, rtol in (("float32", 1e-5), ("float64", 1e-12)):
        arrays = {"w": got["w_" + tag].astype(np.float64),
                  "x": got["x_" + tag].astype(np.float64)}
        want = brute_force(DIST, ranges, arrays)
        np.testing.assert_allclose(got["D_" + tag], want, rtol=rtol, atol=rtol * 10)
        gauss = np.exp(-want / 64) @ arrays["x"][0]
        np.testing.assert_allclose(got["G_" + tag], gauss, rtol=rtol * 10, atol=rtol * 10)
