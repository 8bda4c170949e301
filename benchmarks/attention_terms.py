"""Fused attention with and without terms on its scores against torch's SDPA (issue 31,
items 2 and 7): non-causal, causal, a padding mask ``+ M[b,j]``, ALiBi under the causal
mask, a causal window and a ``+ bias[h,i,j]`` tensor, forward and forward + backward.

    PYTHONPATH=src python benchmarks/attention_terms.py [--quick] [--cpu avx2] [--case NAME]

One thread (OMP_NUM_THREADS=1, torch.set_num_threads(1)), CPU time
(time.process_time), einfuse and SDPA interleaved round by round, the median of the
rounds; the figure printed is SDPA's time over einfuse's (above 1: einfuse is faster).
SDPA gets the same scores as a float ``attn_mask`` computed outside the timing (or
``is_causal`` for the plain causal case).  Each program's output is checked against
SDPA's before it is timed.  ``--cpu avx2`` builds einfuse for AVX2 + FMA
(EINFUSE_CPU=avx2) and runs torch's AVX2 kernels and GEMMs (ATEN_CPU_CAPABILITY,
MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA; without them MKL's sgemm under SDPA
still runs AVX-512), as on a Zen 3 host; it must be given on the command line, before torch and einfuse load."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    parser.add_argument("--cpu", default=None, help="EINFUSE_CPU target (e.g. avx2)")
    parser.add_argument("--case", action="append", default=[],
                        help="only cases whose name contains this (repeatable)")
    parser.add_argument("--rounds", type=int, default=7)
    return parser.parse_args()


ARGS = _arguments() if __name__ == "__main__" else None
os.environ["OMP_NUM_THREADS"] = "1"
if ARGS is not None and ARGS.cpu:
    os.environ["EINFUSE_CPU"] = ARGS.cpu
    if ARGS.cpu == "avx2":      # torch's kernels and its GEMMs (MKL, oneDNN) as well
        os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
        os.environ["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
        os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"

import numpy as np  # noqa: E402
import torch  # noqa: E402

import einfuse as ef  # noqa: E402

DOT = "sum[d](Q[b,h,i,d]*K[b,h,j,d]) * {scale}"
SOFTMAX = ("\nm[b,h,i]   := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])"
           "\nO[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])")
WINDOW = 128


def cases(B, H, N, D):
    """(name, scores, sizes, the SDPA mask maker, the tensors that want gradients)."""
    return [
        ("non-causal", DOT, (B, H, N), None, ()),
        ("causal", f"where(j <= i, {DOT}, -inf)", (1, H, 2 * N), "causal", ()),
        ("padding-masked", DOT + " + M[b,j]", (B, H, N), "padding", ()),
        ("ALiBi causal", f"where(j <= i, {DOT} + slope[h] * (j - i), -inf)", (B, H, N),
         "alibi", ()),
        ("causal window", f"where(j <= i, where(i - j < W, {DOT}, -inf), -inf)",
         (B, H, N), "window", ()),
        ("bias", DOT + " + bias[h,i,j]", (B, H, N), "bias", ()),
        ("learnable bias", DOT + " + bias[h,i,j]", (B, H, N), "bias", ("bias",)),
    ]


def inputs(kind, B, H, N, D, rng):
    """einfuse's arrays and SDPA's mask (None, "causal" or a float tensor)."""
    arrays = {n: rng.standard_normal((B, H, N, D), dtype=np.float32) for n in "QKV"}
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    mask = kind
    if kind == "padding":
        M = np.zeros((B, N), np.float32)
        for b in range(B):
            M[b, N - N * (b + 1) // (B + 2):] = -np.inf
        arrays["M"], mask = M, M[:, None, None, :]
    elif kind == "alibi":
        slope = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)
        arrays["slope"] = slope
        mask = np.where(j <= i, slope[:, None, None] * (j - i), -np.inf)[None]
    elif kind == "window":
        arrays["W"] = WINDOW
        mask = np.where((j <= i) & (i - j < WINDOW), 0.0, -np.inf)[None]
    elif kind == "bias":
        arrays["bias"] = rng.standard_normal((H, N, N), dtype=np.float32)
        mask = arrays["bias"][None]
    if isinstance(mask, np.ndarray):
        mask = torch.from_numpy(np.ascontiguousarray(mask, np.float32))
    return arrays, mask


def _timed(call, budget):
    times, spent = [], 0.0
    while spent < budget or len(times) < 3:
        start = time.process_time()
        call()
        elapsed = time.process_time() - start
        times.append(elapsed)
        spent += elapsed
        if len(times) >= 30:
            break
    return statistics.median(times)


def _step(fn, tensors):
    for tensor in tensors.values():
        if isinstance(tensor, torch.Tensor):
            tensor.grad = None
    out = fn()
    out.backward(torch.ones_like(out))
    return out.detach()


def contenders(name, scores, sizes, kind, learned, D, train, rng):
    B, H, N = sizes
    scale = float(1.0 / np.sqrt(D))
    arrays, mask = inputs(kind, B, H, N, D, rng)
    program = ef.compile("S[b,h,i,j] := " + scores.format(scale=repr(scale)) + SOFTMAX)
    wanted = ("Q", "K", "V") + tuple(learned)
    ours = {k: (torch.from_numpy(v).requires_grad_(train and k in wanted)
                if isinstance(v, np.ndarray) else v)
            for k, v in arrays.items() if k in program.inputs}
    theirs = {k: torch.from_numpy(arrays[k]).requires_grad_(train) for k in "QKV"}
    if isinstance(mask, torch.Tensor):
        theirs["mask"] = mask.clone().requires_grad_(train and bool(learned))

    def sdpa():
        extra = {"is_causal": True} if mask == "causal" else \
            {"attn_mask": theirs["mask"]} if "mask" in theirs else {}
        return torch.nn.functional.scaled_dot_product_attention(
            theirs["Q"], theirs["K"], theirs["V"], scale=scale, **extra)

    einfuse_call = lambda: program(**ours)     # noqa: E731
    with torch.no_grad():
        got, want = einfuse_call(), sdpa()
    finite = torch.isfinite(want)
    ok = bool(torch.equal(finite, torch.isfinite(got)) and
              torch.allclose(got[finite], want[finite], rtol=1e-3, atol=1e-4))
    if train:
        a = lambda: _step(einfuse_call, ours)    # noqa: E731
        b = lambda: _step(sdpa, theirs)          # noqa: E731
        return a, b, ok
    return (lambda: torch_no_grad(einfuse_call)), (lambda: torch_no_grad(sdpa)), ok


def torch_no_grad(call):
    with torch.no_grad():
        return call()


def main():
    torch.set_num_threads(1)
    quick = ARGS.quick
    B, H, N, D = (1, 2, 128, 64) if quick else (2, 4, 512, 64)
    rounds = 3 if quick else ARGS.rounds
    budget = 0.02 if quick else 0.15
    print(f"einfuse target {os.environ.get('EINFUSE_CPU', 'native')}, torch "
          f"{torch.__version__} capability {torch.backends.cpu.get_cpu_capability()}; "
          f"one thread, CPU time, median of {rounds} interleaved rounds; "
          "SDPA time / einfuse time")
    rng = np.random.default_rng(0)
    for name, scores, sizes, kind, learned in cases(B, H, N, D):
        if ARGS.case and not any(c in name for c in ARGS.case):
            continue
        if quick:
            sizes = (sizes[0], sizes[1], min(sizes[2], 2 * N))
        line = f"{name:16s} {'x'.join(map(str, sizes))}x{D}"
        for train in (False, True):
            if learned and not train:
                continue
            ours, sdpa, ok = contenders(name, scores, sizes, kind, learned, D, train, rng)
            ours(), sdpa()        # (compiled, warm)
            a, b = [], []
            for _ in range(rounds):
                a.append(_timed(ours, budget))
                b.append(_timed(sdpa, budget))
            mine, theirs = statistics.median(a), statistics.median(b)
            line += (f"  {'fwd+bwd' if train else 'fwd'} {theirs / mine:5.2f}x "
                     f"({mine * 1e3:.1f} vs {theirs * 1e3:.1f} ms)"
                     f"{'' if ok else ' VALUES DIFFER'}")
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
