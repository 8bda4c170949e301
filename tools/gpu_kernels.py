"""Diagnostics for a lent GPU: for the bench's kernels, the time of every candidate
launch configuration of einfuse's generated Triton kernel (a wider list than the tuner's),
next to plain hand-written Triton kernels of the same computation, so that a gap can be
placed in einfuse's kernel structure or in its choice of configuration.

    TRITON_INTERPRET=0 PYTHONPATH=src python3 tools/gpu_kernels.py [matmul|dist|gauss ...]

EF_CHUNK=N renders long sums in chunks of N steps instead of triton_helpers.CHUNK (each
chunk is its own software-pipelined loop, then a compensated fold): run once with and once
without it, each in its own process, to see what the chunking costs a kernel.
"""

import os
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import einfuse as ef
from einfuse.backends.triton import helpers as triton_helpers
from einfuse.backends.triton import tuning

if os.environ.get("EF_CHUNK"):   # before anything is rendered
    triton_helpers.CHUNK = int(os.environ["EF_CHUNK"])
    print(f"long sums in chunks of {triton_helpers.CHUNK} steps")

WIDE = [tuning.Config(r, n, k, 0, w, s) for r, n, k, w, s in (
    (64, 64, 32, 4, 3), (64, 128, 32, 4, 3), (128, 64, 32, 4, 3), (128, 128, 32, 8, 3),
    (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4),
    (256, 128, 64, 8, 3), (64, 256, 64, 4, 4), (128, 128, 32, 4, 2), (64, 64, 16, 2, 2),
    (32, 128, 16, 4, 2), (64, 128, 16, 8, 2), (128, 128, 16, 8, 2))]
_search = tuning.search


def logged_search(configs, launch_with, on_gpu):
    print("  tuner's candidates:")
    tiled = all(c.block == 0 for c in configs)
    for config in list(configs) + [c for c in WIDE if tiled and c not in configs]:
        try:
            ms = tuning.measure(lambda: launch_with(config), on_gpu) * 1e3
            print(f"    {config}: {ms:.3f} ms", flush=True)
        except Exception as error:   # noqa: BLE001
            print(f"    {config}: failed {type(error).__name__}: {str(error)[:80]}")
    return _search(configs, launch_with, on_gpu)


tuning.search = logged_search


@triton.jit
def ref_matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, G: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    group = pid // (G * tiles_n)
    first = group * G
    size = min(tiles_m - first, G)
    pm = first + (pid % (G * tiles_n)) % size
    pn = (pid % (G * tiles_n)) // size
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    pa = a + rm[:, None] * sam + rk[None, :] * sak
    pb = b + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        x = tl.load(pa, mask=(rm[:, None] < M) & (rk[None, :] + k < K), other=0.0)
        y = tl.load(pb, mask=(rk[:, None] + k < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
        pa += BK * sak
        pb += BK * sbk
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def ref_dist(w, x, d, K, N, M, BM: tl.constexpr, BN: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K):
        a = tl.load(w + k * N + rm, mask=rm < N, other=0.0)
        b = tl.load(x + k * M + rn, mask=rn < M, other=0.0)
        t = a[:, None] - b[None, :]
        acc += t * t
    tl.store(d + rm[:, None] * M + rn[None, :], acc, mask=(rm[:, None] < N) & (rn[None, :] < M))


def matmul(dtype):
    n = 4096
    A = torch.randn(n, n, device="cuda", dtype=dtype)
    B = torch.randn(n, n, device="cuda", dtype=dtype)
    print(f"matmul {n}^3 {dtype}")
    kernel = ef.compile("C[i,k] := A[i,j] * B[j,k]", backend="triton")
    kernel(A=A, B=B)
    ms = do_bench(lambda: kernel(A=A, B=B))
    print(f"  einfuse (chosen): {ms:.3f} ms, {2 * n**3 / ms / 1e9:.0f} TFLOP/s")
    ms = do_bench(lambda: A @ B)
    print(f"  cuBLAS: {ms:.3f} ms, {2 * n**3 / ms / 1e9:.0f} TFLOP/s")
    C = torch.empty_like(A)
    for bm, bn, bk, w, s in ((128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 4),
                             (256, 128, 64, 8, 3), (128, 128, 32, 4, 4)):
        for g in (1, 8):
            grid = (triton.cdiv(n, bm) * triton.cdiv(n, bn),)
            try:
                run = lambda: ref_matmul[grid](A, B, C, n, n, n, *A.stride(), *B.stride(),  # noqa
                                               *C.stride(), BM=bm, BN=bn, BK=bk, G=g,
                                               num_warps=w, num_stages=s)
                ms = do_bench(run)
                print(f"  hand-written {bm}x{bn}x{bk} w{w} s{s} group {g}: {ms:.3f} ms, "
                      f"{2 * n**3 / ms / 1e9:.0f} TFLOP/s")
            except Exception as error:   # noqa: BLE001
                print(f"  hand-written {bm}x{bn}x{bk}: failed {str(error)[:80]}")


def dist():
    K, N = 784, 4096
    w = torch.randn(K, N, device="cuda")
    x = torch.randn(K, N, device="cuda")
    print(f"dist K={K} N=M={N}")
    kernel = ef.compile("D[i,j] := (w[k,i] - x[k,j])**2", backend="triton")
    out = kernel(w=w, x=x)
    ms = do_bench(lambda: kernel(w=w, x=x))
    flops = 3 * K * N * N
    print(f"  einfuse (chosen): {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s")
    d = torch.empty(N, N, device="cuda")
    for bm, bn, wp in ((64, 64, 4), (128, 128, 8), (128, 128, 4), (64, 128, 4), (128, 64, 4),
                       (128, 256, 8), (256, 128, 8), (64, 256, 8)):
        grid = (triton.cdiv(N, bm), triton.cdiv(N, bn))
        run = lambda: ref_dist[grid](w, x, d, K, N, N, BM=bm, BN=bn, num_warps=wp)  # noqa
        ms = do_bench(run)
        err = float((d - out).abs().max() / out.abs().max())
        print(f"  hand-written {bm}x{bn} w{wp}: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s,"
              f" rel. diff {err:.1e}")


def gauss():
    N, D = 10**5, 3
    x, y = torch.randn(N, D, device="cuda"), torch.randn(N, D, device="cuda")
    b = torch.randn(N, device="cuda")
    print(f"gauss N={N}")
    kernel = ef.compile("o[i] := sum[j](exp(-sum[d]((x[i,d] - y[j,d])**2)) * b[j])",
                        backend="triton")
    kernel(x=x, y=y, b=b)
    ms = do_bench(lambda: kernel(x=x, y=y, b=b))
    print(f"  einfuse (chosen): {ms:.3f} ms, {N * N / ms / 1e9:.1f} G pairs/s")


if __name__ == "__main__":
    wanted = sys.argv[1:] or ["matmul", "dist", "gauss"]
    for case in wanted:
        if case == "matmul":
            matmul(torch.float16)
        elif case == "dist":
            dist()
        elif case == "gauss":
            gauss()
