"""The one cost counter (analysis/cost.py): the counts explain, the sharding planner and a
fused C group report or compare with, against numbers worked out by hand here -- an
attention run as one pass (causal, strict, unmasked, unnormalised, unscaled, a band with
terms, on the C kernel and on Triton's), a contraction split over a mesh, a fused group's
iteration points and the thread decisions they drive."""

import numpy as np
import pytest

import einfuse as ef
from einfuse.analysis.cost import (attention_bytes, attention_flops, attention_pairs,
                                   group_points)
from einfuse.backends.c import build as c_build, fused as c_fused
from einfuse.backends.c.threads import PARALLEL_MIN_WORK, default_threads


def attention(mask="j <= i", normalised=True, scale="* scale", terms="", window=None):
    score = f"sum[d](Q[b,h,i,d]*K[b,h,j,d]) {scale}{terms}".strip()
    s = f"where({mask}, {score}, -inf)" if mask else score
    if window:
        s = f"where({window}, {s}, -inf)"
    last = "sum[j](P[b,h,i,j] * V[b,h,j,e])" + (" / sum[j](P[b,h,i,j])" if normalised
                                                else "")
    return (f"S[b,h,i,j] := {s}\nm[b,h,i] := max[j](S[b,h,i,j])\n"
            f"P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\nO[b,h,i,e] := {last}")


SHAPE = (2, 3, 100, 16)      # 6 batch elements, 100 rows and keys, D = E = 16
QKV = {"Q": SHAPE, "K": SHAPE, "V": SHAPE}
# per pair: dot 2*16, weighted sum 2*16, weight and denominator 3, the scale 1
CASES = {   # keyword arguments: (pairs per batch element, FLOPs per pair, normalised)
    "causal": ({}, 100 * 101 // 2, 68, True),
    "strict": ({"mask": "j < i"}, 100 * 99 // 2, 68, True),
    "unmasked": ({"mask": None}, 100 * 100, 68, True),
    "unnormalised": ({"normalised": False}, 100 * 101 // 2, 68, False),
    "unscaled": ({"scale": ""}, 100 * 101 // 2, 67, True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attention_flops_and_bytes_as_counted_by_hand(case):
    kwargs, pairs, per_pair, normalised = CASES[case]
    extra = {} if kwargs.get("scale") == "" else {"scale": 0.5}
    e = ef.explain(attention(**kwargs), shapes=QKV, **extra)
    flops = 6 * (pairs * per_pair + (100 * 16 if normalised else 0))
    assert e.flops == flops
    assert f"FLOPs                 {flops:,} (" in str(e)
    assert f"    {6 * pairs:,} ({6 * pairs / 1e3:.2f} k) (i, j) pairs computed" in str(e)
    assert e.bytes_read == 6 * (100 * 16 + 100 * (16 + 16)) * 4        # float32 (shapes=)
    assert e.bytes_written == 6 * 100 * 16 * 4


def test_attention_band_with_terms_as_counted_by_hand():
    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((1, 2, 100, 4)) for _ in range(3))
    M, slope = rng.standard_normal((1, 100)), rng.standard_normal(2)
    e = ef.explain(attention(terms=" + M[b,j] + slope[h] * (j - i)", window="i - j < W"),
                   Q=Q, K=K, V=V, M=M, slope=slope, scale=0.3, W=10)
    pairs = sum(min(i + 1, 10) for i in range(100))          # causal, 10 keys back: 955
    assert pairs == 955
    # per pair: dot 8, weighted sum 8, scale 1, two terms 2 each, weight 3
    assert e.flops == 2 * (pairs * (8 + 8 + 1 + 4 + 3) + 100 * 4) == 46640


def test_attention_on_the_triton_kernel_counts_the_same():
    torch = pytest.importorskip("torch")
    from einfuse.backends.triton import backend as triton_backend
    if not triton_backend.available():
        pytest.skip("triton is not installed")
    rng = np.random.default_rng(1)
    Q, K, V = (torch.tensor(rng.standard_normal((1, 2, 100, 4)), dtype=torch.float32)
               for _ in range(3))
    M = torch.tensor(rng.standard_normal((1, 100)), dtype=torch.float32)
    e = ef.explain(attention(terms=" + M[b,j]", window="i - j < W"), Q=Q, K=K, V=V, M=M,
                   scale=0.3, W=4, backend="triton")
    assert "Triton kernel" in str(e)
    pairs = 1 + 2 + 3 + 97 * 4
    assert e.flops == 2 * (pairs * (8 + 8 + 1 + 2 + 3) + 100 * 4) == 18136
    assert e.bytes_read == 2 * (100 * 4 + 100 * 8) * 4


@pytest.mark.parametrize("rows,keys,band", [(7, 5, None), (9, 9, (-2, 0)), (6, 11, (1, 3)),
                                            (5, 5, (3, 2)), (8, 4, (-20, 20))])
def test_attention_pairs_are_those_of_the_band(rows, keys, band):
    lower, upper = band or (-rows, keys)
    want = sum(1 for i in range(rows) for j in range(keys) if lower <= j - i <= upper)
    assert attention_pairs(rows, keys, band) == want
    assert attention_flops(3, want, rows, 2, 5, scaled=False, terms=1, normalised=False) == \
        3 * want * (4 + 10 + 2 + 3)
    assert attention_bytes(3, rows, keys, 2, 5, 4) == (3 * (rows * 2 + keys * 7) * 4,
                                                       3 * rows * 5 * 4)


# -- a contraction split over a mesh -------------------------------------------------------

MATMUL = "C[i,j] := sum[k](A[i,k]*B[k,j])"
MATMUL_SHAPES = {"A": (16, 32), "B": (32, 8)}


@pytest.mark.parametrize("shard,mesh,local", [
    ({"k": "x"}, {"x": 4}, 16 * 8 * (32 // 4) * 2),           # the reduction split
    ({"i": "x", "j": "y"}, {"x": 4, "y": 2}, (16 // 4) * (8 // 2) * 32 * 2),
    ({"i": "x"}, {"x": 2}, (16 // 2) * 8 * 32 * 2),
])
def test_sharded_contraction_flops_as_counted_by_hand(shard, mesh, local):
    whole = 16 * 8 * 32 * 2                 # a multiply and a step of the sum per point
    e = ef.explain(MATMUL, shapes=MATMUL_SHAPES, mesh=mesh, shard=shard)
    (statement,) = e.plan.statements
    assert statement.flops == whole and statement.local_flops == e.plan.local_flops == local
    assert ef.explain(MATMUL, shapes=MATMUL_SHAPES).flops == whole
    assert f"{local:,}" in str(e)


def test_sharded_program_flops_as_counted_by_hand():
    mlp = "h[b,f] := relu(sum[d](x[b,d]*W1[d,f])); y[b,o] := sum[f](h[b,f]*W2[f,o])"
    e = ef.explain(mlp, shapes={"x": (32, 64), "W1": (64, 256), "W2": (256, 48)},
                   mesh={"model": 4}, shard={"f": "model"})
    first = 32 * 256 * (64 * 2 + 1)           # the product's points, and relu per output
    second = 32 * 48 * 256 * 2
    assert [(s.flops, s.local_flops) for s in e.plan.statements] == \
        [(first, first // 4), (second, second // 4)]


# -- a fused C group -----------------------------------------------------------------------

LAYERNORM_GRADIENTS = """mu[i] := sum[j](X[i,j]) / 61
r[i] := 1 / sqrt(sum[j]((X[i,j] - mu[i])**2) / 61 + 0.00001)
dg[j] := dy[i,j] * (X[i,j] - mu[i]) * r[i]
db[j] := dy[i,j]"""


@pytest.mark.skipif(c_build.find_compiler() is None, reason="fusion runs C kernels")
@pytest.mark.parametrize("rows", [1000, 90])
def test_fused_group_work_is_its_members_points(monkeypatch, rows):
    seen = []
    run = c_fused.run

    def spy(members, thread_rows=frozenset()):
        seen.append((group_points([m.call.bounds for m in members]),
                     c_fused.is_adaptive(members), c_fused.column_slices(members)))
        return run(members, thread_rows)
    monkeypatch.setattr(c_fused, "run", spy)
    rng = np.random.default_rng(2)
    X, dy = rng.standard_normal((rows, 61)), rng.standard_normal((rows, 61))
    ef.compile(LAYERNORM_GRADIENTS, outputs=("dg", "db"))(X=X, dy=dy)
    work = 4 * rows * 61                    # four members, each over (i, j)
    big = work >= PARALLEL_MIN_WORK
    assert big == (rows == 1000)
    (got,) = seen
    assert got == (work, big, default_threads() if big else 1)
