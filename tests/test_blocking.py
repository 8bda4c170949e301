"""Register blocks and tiles chosen from the machine (plan/blocking.py), on both the
AVX2 and the AVX-512 code paths, and precision="fast"'s distance as a matrix product
(rewrite/rules.py "square-of-difference-expanded").

The machine's facts decide the blocks: each block fits its register file and keeps the
FMA units busy, and the kernels built for either target (EINFUSE_CPU, in a child
process: the target is read once per process) agree with tests/oracle.py on extents
that leave partial row blocks and partial lane tiles."""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis import machine as machine_module
from einfuse.backends.c import build as c_build
from einfuse.errors import OptionError
from einfuse.lang.parser import parse
from einfuse.analysis.spec import analyse
from einfuse.plan import blocking
from einfuse.rewrite.rules import rewrite

from oracle import brute_force

HOST_FLAGS = machine_module._cpu_flags()
TARGETS = {"avx2": {"avx2", "fma", "bmi2"},
           "avx512": {"avx512f", "avx512bw", "avx512dq", "avx512vl"}}


def _machine(target: str) -> machine_module.Machine:
    """A target's facts as the host would give them, whether or not it can run them."""
    march, width, registers, _, l1, l2 = machine_module._TARGETS[target]
    return machine_module.Machine(target, march, width, registers, True, l1d_bytes=l1,
                                  l2_bytes=l2)


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("itemsize", [4, 8])
def test_blocks_fit_the_register_file_and_hide_fma_latency(target, itemsize):
    chosen = blocking.blocking_for(_machine(target))
    m = chosen.machine
    for block, reserve in ((chosen.statement_block(itemsize), blocking.STATEMENT_RESERVE),
                           (chosen.product_block(itemsize), blocking.PRODUCT_RESERVE)):
        assert block.registers(reserve) <= m.vector_registers
        assert block.rows * block.vectors >= m.accumulators
        assert block.lanes == m.vector_bytes // itemsize
    assert chosen.tile(itemsize) * itemsize <= m.vector_registers * m.vector_bytes // 2


def test_a_smaller_register_file_gets_a_smaller_block():
    wide = blocking.blocking_for(_machine("avx512")).statement_block(4)
    narrow = blocking.blocking_for(_machine("avx2")).statement_block(4)
    assert narrow.rows * narrow.vectors < wide.rows * wide.vectors
    # more latency to hide wants more chains, until the file runs out
    slow = dataclasses.replace(_machine("avx2"), fma_latency=8)
    block = blocking.blocking_for(slow).statement_block(4)
    assert block.registers(blocking.STATEMENT_RESERVE) <= 16


def test_best_block_with_too_few_registers_is_still_a_block():
    block = blocking.best_block(registers=3, accumulators=8, reserve=2, lanes=8)
    assert block.rows >= 1 and block.vectors >= 1


CHILD = """
import numpy as np, einfuse as ef
from einfuse.plan.blocking import block_for
rng = np.random.default_rng(1)
w, x = rng.standard_normal((19, 23)).astype(np.float32), rng.standard_normal((19, 45)).astype(np.float32)
D = ef.ein("D[i,j] := (w[k,i] - x[k,j])**2", w=w, x=x, backend="c")
C = ef.ein("C[i,j] := w[k,i] * x[k,j]", w=w, x=x, backend="c")
Q, K, V = (rng.standard_normal((1, 2, 37, 8)).astype(np.float32) for _ in range(3))
attention = '''S[b,h,i,j] := {mask}
m[b,h,i] := max[j](S[b,h,i,j])
P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])
O[b,h,i,d] := sum[j](P[b,h,i,j] * V[b,h,j,d]) / sum[j](P[b,h,i,j])'''
dot = "sum[d](Q[b,h,i,d]*K[b,h,j,d]) * 0.25"
A = ef.ein(attention.format(mask=dot), Q=Q, K=K, V=V, backend="c")
M = ef.ein(attention.format(mask="where(j <= i, " + dot + ", -inf)"), Q=Q, K=K, V=V, backend="c")
np.savez(OUT, D=D, C=C, A=A, M=M, Q=Q, K=K, V=V, w=w, x=x, block=block_for(np.dtype(np.float32)))
"""


def _softmax_attention(Q, K, V, causal):
    S = np.einsum("bhid,bhjd->bhij", Q.astype(np.float64), K.astype(np.float64)) * 0.25
    if causal:
        S = np.where(np.tri(S.shape[-1], dtype=bool), S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", P, V.astype(np.float64)) / P.sum(-1, keepdims=True)


@pytest.mark.skipif(c_build.find_compiler() is None, reason="builds C kernels")
# (the AVX-512 build is what every other test runs on an AVX-512 host: the slow step
# builds it again here; the default run keeps the AVX2 one, DEVELOPERS.md's target)
@pytest.mark.parametrize("target", [pytest.param(t, marks=pytest.mark.slow) if t == "avx512"
                                    else t for t in sorted(TARGETS)])
def test_kernels_of_either_target_agree_with_the_oracle(target, tmp_path):
    if not TARGETS[target] <= HOST_FLAGS:
        pytest.skip(f"the host cannot run {target} code")
    out = tmp_path / "out.npz"
    env = dict(os.environ, EINFUSE_CPU=target)
    subprocess.run([sys.executable, "-c", f"OUT = {str(out)!r}\n" + CHILD], env=env,
                   check=True, timeout=600)
    got = np.load(out)
    rows, lanes = (int(v) for v in got["block"])
    expected = blocking.blocking_for(_machine(target)).statement_block(4)
    assert (rows, lanes) == (expected.rows, expected.width)
    w, x = got["w"], got["x"]
    assert 23 % rows and 45 % lanes    # partial row blocks and lane tiles are exercised
    ranges = {"i": (0, 23), "j": (0, 45), "k": (0, 19)}
    for name, text in (("D", "D[i,j] := (w[k,i] - x[k,j])**2"),
                       ("C", "C[i,j] := w[k,i] * x[k,j]")):
        want = brute_force(text, ranges, {"w": w.astype(np.float64),
                                          "x": x.astype(np.float64)})
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-4)
    for name, causal in (("A", False), ("M", True)):
        np.testing.assert_allclose(got[name], _softmax_attention(got["Q"], got["K"], got["V"],
                                                                 causal), rtol=1e-4,
                                   atol=1e-5)


# -- precision="fast" ------------------------------------------------------------------

DIST = "D[i,j] := (w[k,i] - x[k,j])**2"


def _rhs(text):
    return analyse(parse(text)).rhs


def test_the_expansion_fires_only_with_the_option():
    assert rewrite(_rhs(DIST)).fired == ()
    fired = rewrite(_rhs(DIST), options={"precision=fast"}).fired
    # (the expansion's squares w*w and x*x then written as squares: product-as-square)
    assert fired[0] == "square-of-difference-expanded" and \
        set(fired[1:]) <= {"product-as-square"}
    # no cross term to gain: a norm, or a difference of one tensor with itself
    for text in ("n[i] := (w[k,i] - 1)**2", "d[i] := (w[k,i] - w[k,i])**2"):
        assert rewrite(_rhs(text), options={"precision=fast"}).fired == ()


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_fast_distance_is_within_the_documented_tolerance(backend):
    if backend == "c" and c_build.find_compiler() is None:
        pytest.skip("builds C kernels")
    rng = np.random.default_rng(2)
    w, x = rng.standard_normal((40, 17)), rng.standard_normal((40, 21))
    ranges = {"i": (0, 17), "j": (0, 21), "k": (0, 40)}
    want = brute_force(DIST, ranges, {"w": w, "x": x})
    for dtype, eps in ((np.float64, 2.0 ** -52), (np.float32, 2.0 ** -23)):
        a, b = w.astype(dtype), x.astype(dtype)
        got = ef.ein(DIST, w=a, x=b, backend=backend, precision="fast")
        # docs/performance.md: |error| <= K * eps * (|a|^2 + |b|^2) summed over k
        bound = 4 * 40 * eps * ((a.astype(np.float64) ** 2).sum(0)[:, None] +
                                (b.astype(np.float64) ** 2).sum(0)[None, :])
        assert np.all(np.abs(got - want) <= bound)


def test_without_the_option_the_exact_semantics_stay():
    w = np.array([[np.inf, 1.0, 2.0], [0.0, 3.0, 1e8]])
    x = np.array([[1.0, 2.0], [1.0, 1e8 + 1.0]])
    ranges = {"i": (0, 3), "j": (0, 2), "k": (0, 2)}
    want = brute_force(DIST, ranges, {"w": w, "x": x})
    for backend in ("numpy", "c") if c_build.find_compiler() else ("numpy",):
        exact = ef.ein(DIST, w=w, x=x, backend=backend)
        np.testing.assert_allclose(exact, want, rtol=1e-15)
        assert np.isposinf(exact[0]).all() and exact[2, 1] == 1.0   # inf stays; 1 exactly
        np.testing.assert_array_equal(ef.ein(DIST, w=w, x=x, backend=backend,
                                             precision="exact"), exact)
        fast = ef.ein(DIST, w=w, x=x, backend=backend, precision="fast")
        assert np.isnan(fast[0]).all()      # inf - inf: the cancellation docs name
        assert fast[2, 1] != want[2, 1]     # 1e16-scale norms cancel: 1.0 is lost


def test_precision_takes_exact_or_fast():
    with pytest.raises(OptionError, match="precision"):
        ef.compile(DIST, precision="approximate")
