"""For a lent GPU: the fused Triton attention kernel (backends/triton_attention.py)
against torch's scaled_dot_product_attention.

1. correctness, through einfuse's own entry (``ef.compile`` of the attention program on
   CUDA tensors), against SDPA of the same inputs in float32 (no TF32), for float16,
   bfloat16 and float32, B=4 H=8, N in {1024, 4096}, D in {64, 128}, causal and not;
   it also checks that the fused kernel ran (not the statements), and the gradients
   under autograd (the kernel's forward, the formula's backward) at N=1024 D=64;
2. time (triton.testing.do_bench) of every candidate configuration (float16 at N=4096
   and float32 at N=1024: all of them; elsewhere the default) against SDPA in the same dtype, as TFLOP/s
   (4 * B * H * N^2 * D, halved when causal) and the ratio to SDPA's time; 'kernel' is
   the launch alone, 'einfuse' the whole call (argument checks, the value's finiteness
   check, the launch).

    TRITON_INTERPRET=0 PYTHONPATH=src python3 tools/gpu_attention.py [--quick]

Failures are printed and the script goes on."""

import sys
import time
import traceback

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import einfuse as ef
from einfuse.backends.triton import attention as ta

B, H = 4, 8
SIZES = [(1024, 64), (1024, 128), (4096, 64), (4096, 128)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 2e-5}
STATEMENT = ("O[b,h,i,e] := sum[j](exp({s} - max[k]({sk})) * V[b,h,j,e]) / "
             "sum[j](exp({s} - max[k]({sk})))")


def text(causal: bool) -> str:
    def score(j):
        dot = f"sum[d](Q[b,h,i,d]*K[b,h,{j},d]) * scale"
        return f"where({j} <= i, {dot}, -inf)" if causal else dot
    return STATEMENT.format(s=score("j"), sk=score("k"))


KERNELS = {causal: ef.compile(text(causal)) for causal in (False, True)}
launches = []
_launch = ta.launch


def counting_launch(*args, **kwargs):
    config = _launch(*args, **kwargs)
    launches.append(config)
    return config


ta.launch = counting_launch


def inputs(n, d, dtype):
    g = torch.Generator(device="cuda").manual_seed(n + d)
    return [torch.randn(B, H, n, d, device="cuda", dtype=dtype, generator=g)
            for _ in range(3)]


def check(n, d, dtype, causal):
    q, k, v = inputs(n, d, dtype)
    scale = d ** -0.5
    launches.clear()
    got = KERNELS[causal](Q=q, K=k, V=v, scale=scale)
    torch.cuda.synchronize()
    if not launches:
        return "FAIL: the fused kernel did not run"
    torch.backends.cuda.matmul.allow_tf32 = False
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                              is_causal=causal, scale=scale)
    error = (got.float() - expected).abs().max().item()
    ok = got.dtype == dtype and got.shape == expected.shape and error <= TOLERANCE[dtype]
    return f"{'ok  ' if ok else 'FAIL'} max |err| {error:.2e} (tol {TOLERANCE[dtype]:.0e})"


def check_gradients(n, d, dtype, causal):
    """Under autograd: the kernel's forward, the statements' formula backward."""
    q, k, v = (t.requires_grad_() for t in inputs(n, d, dtype))
    scale = d ** -0.5
    launches.clear()
    out = KERNELS[causal](Q=q, K=k, V=v, scale=scale)
    seed = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), seed)
    if not launches:
        return "FAIL: the fused kernel did not run"
    wide = [t.detach().float().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*wide, is_causal=causal, scale=scale)
    want = torch.autograd.grad(expected, wide, seed.float())
    error = max((a.float() - b).abs().max().item() for a, b in zip(got, want))
    tol = 4 * TOLERANCE[dtype]
    return f"{'ok  ' if error <= tol else 'FAIL'} max |grad err| {error:.2e} (tol {tol:.0e})"


def kernel_only(q, k, v, out, causal, scale, config):
    operands = [ta.Operand(t, tuple(t.stride())) for t in (q, k, v, out)]
    shape = q.shape

    def go():
        with ta.forced_config(config):
            _launch(*operands, (shape[0], shape[1]), shape[2], shape[2], shape[3],
                    shape[3], scale * 1.4426950408889634, 1 if causal else 0, True, False)
    return go


def bench(n, d, dtype, causal, configs):
    q, k, v = inputs(n, d, dtype)
    scale = d ** -0.5
    flops = 4 * B * H * n * n * d * (0.5 if causal else 1.0)
    sdpa = do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                           scale=scale), warmup=5, rep=25)
    name = str(dtype).split(".")[-1]
    print(f"  {name:8} N={n:5} D={d:3} {'causal' if causal else 'full  '}  SDPA "
          f"{sdpa:7.3f} ms {flops / sdpa / 1e9:6.1f} TFLOP/s", flush=True)
    out = torch.empty_like(q)
    kernel = KERNELS[causal]
    for config in configs:
        try:
            ms = do_bench(kernel_only(q, k, v, out, causal, scale, config), warmup=5, rep=25)
            with ta.forced_config(config):
                whole = do_bench(lambda: kernel(Q=q, K=k, V=v, scale=scale), warmup=5,
                                 rep=25)
            print(f"    {str(config):18} kernel {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s "
                  f"x{ms / sdpa:5.2f} | einfuse {whole:7.3f} ms x{whole / sdpa:5.2f}",
                  flush=True)
        except Exception as error:      # noqa: BLE001 -- print and go on
            print(f"    {str(config):18} failed: {type(error).__name__}: "
                  f"{str(error).splitlines()[0][:100]}", flush=True)


def main():
    quick = "--quick" in sys.argv
    start = time.time()
    print(f"{torch.cuda.get_device_name()}  B={B} H={H}")
    print("correctness (einfuse vs SDPA in float32):")
    for dtype in DTYPES:
        for n, d in SIZES:
            for causal in (False, True):
                try:
                    result = check(n, d, dtype, causal)
                except Exception as error:      # noqa: BLE001
                    result = f"FAIL: {type(error).__name__}: {error}"
                    traceback.print_exc(limit=2)
                print(f"  {str(dtype).split('.')[-1]:8} N={n:5} D={d:3} "
                      f"{'causal' if causal else 'full  '} {result}", flush=True)
    print("gradients under autograd (N=1024 D=64):")
    for dtype in DTYPES:
        for causal in (False, True):
            try:
                result = check_gradients(1024, 64, dtype, causal)
            except Exception as error:      # noqa: BLE001
                result = f"FAIL: {type(error).__name__}: {error}"
            print(f"  {str(dtype).split('.')[-1]:8} {'causal' if causal else 'full  '} "
                  f"{result}", flush=True)
    print("time (do_bench):")
    for dtype in DTYPES:
        name = str(dtype).split(".")[-1]
        for n, d in SIZES:
            # every candidate: float16 at N=4096, float32 at N=1024 (its dots are
            # slow); the default elsewhere; --quick: the defaults at N=4096
            sweep = not quick and ((dtype == torch.float16 and n == 4096) or
                                   (dtype == torch.float32 and n == 1024))
            if not sweep and (n != 4096 or (quick and dtype == torch.float32 and d == 128)):
                continue
            for causal in (False, True):
                configs = ta.candidates(name, d) if sweep else ta.candidates(name, d)[:1]
                try:
                    bench(n, d, dtype, causal, configs)
                except Exception as error:      # noqa: BLE001
                    print(f"  {name} N={n} D={d} causal={causal} failed: "
                          f"{type(error).__name__}: {error}", flush=True)
    print(f"done in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
