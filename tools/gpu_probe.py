"""Measurements for a lent GPU session (the `device` tool) that `einfuse bench` does not
take: Triton's launch paths and their host cost, einfuse's per-call host time on a tiny
statement (with a profile), fused attention against torch SDPA at float16, and the seed
scan-MLP of issue 12 under jax.jit on the GPU.  Each part prints its own lines and a
failing part prints its error and lets the others run.

    python3 tools/gpu_probe.py [launch] [overhead] [attention] [scan]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
import traceback


def _per_call(fn, calls: int, sync) -> float:
    """Host microseconds per call, launches queued and synchronised once at the end."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6


def _median_ms(fn, sync, repeat: int = 20) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e3


def launch():
    """Triton's JITFunction.run against the compiled kernel's own launcher."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def double(x, y, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y + offsets, tl.load(x + offsets, mask=mask) * 2, mask=mask)

    x = torch.randn(16, device="cuda")
    y = torch.empty_like(x)
    sync = torch.cuda.synchronize
    compiled = double[(1,)](x, y, 16, BLOCK=16)
    print("launch: JITFunction.run returns", type(compiled).__name__)
    print(f"launch: fn[grid](...)             {_per_call(lambda: double[(1,)](x, y, 16, BLOCK=16), 5000, sync):7.1f} us")
    runner = compiled[(1, 1, 1)]
    print(f"launch: compiled[grid](all args)  {_per_call(lambda: runner(x, y, 16, 16), 5000, sync):7.1f} us")
    assert torch.equal(y, x * 2)
    stream = torch.cuda.current_stream().cuda_stream
    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    print(f"launch: compiled.run(raw)          {_per_call(lambda: run(1, 1, 1, stream, function, meta, None, None, None, x, y, 16, 16), 5000, sync):7.1f} us")
    print(f"launch: torch.empty               {_per_call(lambda: torch.empty(16, device='cuda'), 5000, sync):7.1f} us")
    print(f"launch: torch.tensor([1.0],cuda)  {_per_call(lambda: torch.tensor([1.0], device='cuda'), 2000, sync):7.1f} us")
    print(f"launch: torch x * 2               {_per_call(lambda: x * 2, 5000, sync):7.1f} us")
    print(f"launch: current_stream            {_per_call(lambda: torch.cuda.current_stream().cuda_stream, 5000, sync):7.1f} us")
    import inspect
    from triton.runtime.jit import JITFunction
    source = inspect.getsource(JITFunction.run)
    print("launch: JITFunction.run tail:\n" + "\n".join(source.splitlines()[-12:]))


def overhead():
    import torch
    import einfuse as ef
    sync = torch.cuda.synchronize
    x = torch.randn(16, device="cuda")
    kernel = ef.compile("y[i] := x[i] * 2")
    kernel(x=x)
    print(f"overhead: einfuse y[i] := x[i]*2 (16)  {_per_call(lambda: kernel(x=x), 2000, sync):7.1f} us per call")
    a = torch.randn(64, 64, device="cuda")
    b = torch.randn(64, 64, device="cuda")
    mm = ef.compile("C[i,j] := A[i,k] * B[k,j]")
    mm(A=a, B=b)
    print(f"overhead: einfuse 64x64 matmul        {_per_call(lambda: mm(A=a, B=b), 2000, sync):7.1f} us per call")
    print(f"overhead: torch 64x64 matmul          {_per_call(lambda: a @ b, 2000, sync):7.1f} us per call")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        kernel(x=x)
    sync()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(22)
    print("overhead: profile of 500 calls (tottime)")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-3000:])


def attention():
    import torch
    import torch.nn.functional as F
    import einfuse as ef
    sync = torch.cuda.synchronize
    B, H, N, D = 4, 8, 4096, 64
    for dtype in (torch.float16,):
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(3))
        for causal in (False, True):
            sdpa = _median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), sync)
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            print(f"attention: SDPA {dtype} causal={causal} B={B} H={H} N={N} D={D}: {sdpa:.3f} ms "
                  f"({flops / sdpa / 1e9:.0f} TFLOP/s)")
    print("attention: einfuse statements on Triton (float32, N=1024):")
    try:
        n = 1024
        q, k, v = (torch.randn(B, H, n, D, device="cuda") for _ in range(3))
        program = ef.compile("""
            S[b,h,i,j] := q[b,h,i,d] * k[b,h,j,d] * 0.125
            M[b,h,i] := max[j](S[b,h,i,j])
            E[b,h,i,j] := exp(S[b,h,i,j] - M[b,h,i])
            L[b,h,i] := sum[j](E[b,h,i,j])
            O[b,h,i,d] := E[b,h,i,j] * v[b,h,j,d] / L[b,h,i]""", outputs="O")
        start = time.perf_counter()
        out = program(q=q, k=k, v=v)
        sync()
        print(f"attention:   first call {time.perf_counter() - start:.1f} s")
        ms = _median_ms(lambda: program(q=q, k=k, v=v), sync, 5)
        ref = F.scaled_dot_product_attention(q, k, v)
        err = ((out - ref).norm() / ref.norm()).item()
        print(f"attention:   einfuse {ms:.3f} ms; SDPA float32 "
              f"{_median_ms(lambda: F.scaled_dot_product_attention(q, k, v), sync):.3f} ms; rel err {err:.2e}")
    except Exception:
        traceback.print_exc(limit=4)


def scan():
    import numpy as np
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, "src")
    from einfuse.bench.jit_cases import seed_function
    print("scan: jax devices", jax.devices())
    rng = np.random.default_rng(0)
    for steps, hidden, chains in ((8000, 12, 0), (2000, 32, 256)):
        params = [jnp.asarray(rng.standard_normal(s)) for s in ((1, hidden), (hidden, hidden), (hidden, 1))]
        shape = (chains, steps, 1) if chains else (steps, 1)
        noise = jnp.asarray(rng.standard_normal(shape) * 0.1)
        fn = jax.vmap(seed_function, in_axes=(None, 0)) if chains else seed_function
        for name, f in (("forward", jax.jit(fn)),
                        ("grad", jax.jit(jax.grad(lambda p, n: fn(p, n).sum())))):
            sync = lambda: jax.block_until_ready(f(params, noise))  # noqa: E731
            ms = _median_ms(sync, lambda: None, 10)
            print(f"scan: jax.jit {name} steps={steps} hidden={hidden} chains={chains} on "
                  f"{noise.devices()}: {ms:.3f} ms")
    try:
        import einfuse as ef
        params = [jnp.asarray(rng.standard_normal(s)) for s in ((1, 12), (12, 12), (12, 1))]
        noise = jnp.asarray(rng.standard_normal((8000, 1)) * 0.1)
        fast = ef.jit(seed_function)
        out = jax.block_until_ready(fast(params, noise))
        ref = jax.jit(seed_function)(params, noise)
        ms = _median_ms(lambda: jax.block_until_ready(fast(params, noise)), lambda: None, 10)
        print(f"scan: ef.jit on GPU arrays: {ms:.3f} ms, result on {out.devices()}, "
              f"max diff {float(jnp.max(jnp.abs(out - ref))):.2e}")
    except Exception:
        traceback.print_exc(limit=6)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["launch", "overhead", "attention", "scan"]
    for part in parts:
        print(f"=== {part}", flush=True)
        try:
            globals()[part]()
        except Exception:
            traceback.print_exc(limit=6)
        sys.stdout.flush()
