"""Where a call's time goes on a GPU: the kernel alone (do_bench of the Triton launch),
one synchronised call, and a profile of einfuse's host-side work per call.

    TRITON_INTERPRET=0 PYTHONPATH=src python3 tools/gpu_overhead.py
"""

import cProfile
import pstats
import time

import torch
from triton.testing import do_bench

import einfuse as ef


def per_call(fn, n=200):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e3


def case(label, statement, **tensors):
    kernel = ef.compile(statement, backend="triton")
    call = lambda: kernel(**tensors)   # noqa: E731
    call()
    torch.cuda.synchronize()
    queued = do_bench(call)
    synced = per_call(call)
    start = time.perf_counter()
    for _ in range(200):
        call()
    host = (time.perf_counter() - start) / 200 * 1e3
    torch.cuda.synchronize()
    print(f"{label}: do_bench {queued:.3f} ms, synchronised call {synced:.3f} ms, "
          f"host time per call {host:.3f} ms", flush=True)
    return call


if __name__ == "__main__":
    half = dict(device="cuda", dtype=torch.float16)
    A, B = torch.randn(4096, 4096, **half), torch.randn(4096, 4096, **half)
    call = case("matmul 4096^3 float16", "C[i,k] := A[i,j] * B[j,k]", A=A, B=B)
    print(f"  cuBLAS: do_bench {do_bench(lambda: A @ B):.3f} ms, synchronised "
          f"{per_call(lambda: A @ B):.3f} ms")
    X = torch.randn(8192, 8192, device="cuda")
    case("logsumexp 8192^2", "z[i] := logsumexp[j](X[i,j])", X=X)
    W = torch.randn(50000, 256, device="cuda")
    idx = torch.randint(0, 50000, (262144,), device="cuda")
    embed = case("embed", "E[b,d] := W[idx[b], d]", W=W, idx=idx)
    small = torch.randn(64, 64, device="cuda")
    case("tiny 64x64 matmul", "C[i,k] := A[i,j] * B[j,k]", A=small, B=small)
    # the H200 run's outliers: a synchronised attention call took 315 µs more than its
    # kernels, an embed call 289 µs (matmul's 35): the host's time per call says whether
    # that is Python and launches or waiting on the GPU
    from einfuse.bench.gpu_programs import PLAIN_ATTENTION
    Q, K, V = (torch.randn(4, 8, 4096, 64, **half) for _ in range(3))
    attention = case("attention B=4 H=8 N=4096 D=64 float16",
                     PLAIN_ATTENTION.format(scale=repr(0.125)), Q=Q, K=K, V=V)
    for label, fn in (("attention", attention), ("embed", embed), ("matmul", call)):
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(100):
            fn()
            torch.cuda.synchronize()
        profile.disable()
        print(f"--- {label}: profile of 100 synchronised calls (tottime)")
        pstats.Stats(profile).sort_stats("tottime").print_stats(18)
