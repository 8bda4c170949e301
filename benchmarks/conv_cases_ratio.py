"""Issue 31 item 4: einfuse's convolutions written as statements against torch's, one
thread, CPU time (time.process_time), the two interleaved, median of repeats, forward
(torch tensors, no grad) and forward + backward (torch autograd through einfuse).
Prints our time over torch's per case (below 1.5 is the issue's target).

    OMP_NUM_THREADS=1 python benchmarks/conv_cases_ratio.py [--repeats 15] [--case dil]
        [--cpu avx2]

``--cpu avx2`` stands for an AVX2-only Zen 3 on an AVX-512 host: einfuse built for AVX2
+ FMA (EINFUSE_CPU), torch's kernels and GEMMs on AVX2 (ATEN_CPU_CAPABILITY,
MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA, as benchmarks/attention_terms.py), and
NumPy's OpenBLAS on its Haswell kernels (OPENBLAS_CORETYPE), which it runs on a Zen 3;
it must be given on the command line (read before torch and NumPy load).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
if "--cpu" in sys.argv[1:-1] and sys.argv[sys.argv.index("--cpu") + 1] == "avx2":
    os.environ.update(EINFUSE_CPU="avx2", ATEN_CPU_CAPABILITY="avx2",
                      MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2",
                      OPENBLAS_CORETYPE="Haswell")

import numpy as np
import torch
import torch.nn.functional as F

import einfuse as ef

CASES = {
    "s2": ("conv2d 8x16x64^2 * 32x16x3^2 s2 p1",
           "y[b,o,i,j] := x[b,c,2*i+p-1,2*j+q-1] * w[o,c,p,q]", (8, 16, 64, 64),
           (32, 16, 3, 3), {"pad": 0, "ranges": {"i": 32, "j": 32}},
           lambda x, w: F.conv2d(x, w, stride=2, padding=1)),
    "s1": ("conv2d 8x32x32^2 * 64x32x3^2 s1 p1",
           "y[b,o,i,j] := x[b,c,i+p-1,j+q-1] * w[o,c,p,q]", (8, 32, 32, 32),
           (64, 32, 3, 3), {"pad": 0, "ranges": {"i": 32, "j": 32}},
           lambda x, w: F.conv2d(x, w, padding=1)),
    "dil": ("conv2d 8x32x32^2 * 64x32x3^2 d2 p2",
            "y[b,o,i,j] := x[b,c,i+2*p-2,j+2*q-2] * w[o,c,p,q]", (8, 32, 32, 32),
            (64, 32, 3, 3), {"pad": 0, "ranges": {"i": 32, "j": 32}},
            lambda x, w: F.conv2d(x, w, padding=2, dilation=2)),
    "dil64": ("conv2d 4x16x64^2 * 32x16x3^2 d2 p2 (bench)",
              "y[b,o,i,j] := x[b,c,i+2*p-2,j+2*q-2] * w[o,c,p,q]", (4, 16, 64, 64),
              (32, 16, 3, 3), {"pad": 0, "ranges": {"i": 64, "j": 64}},
              lambda x, w: F.conv2d(x, w, padding=2, dilation=2)),
    "c1": ("conv1d 8x64x1024 * 64x64x3 p1", "y[b,o,i] := x[b,c,i+p-1] * w[o,c,p]",
           (8, 64, 1024), (64, 64, 3), {"pad": 0, "ranges": {"i": 1024}},
           lambda x, w: F.conv1d(x, w, padding=1)),
    "c1s2": ("conv1d 8x32x512 * 32x32x5 s2 valid", "y[b,o,i] := x[b,c,2*i+p] * w[o,c,p]",
             (8, 32, 512), (32, 32, 5), {}, lambda x, w: F.conv1d(x, w, stride=2)),
}


def _median_ratio(ours, theirs, repeats):
    for f in (ours, theirs):
        f()
        f()
    a, b = [], []
    for _ in range(repeats):
        for f, into in ((ours, a), (theirs, b)):
            t = time.process_time()
            f()
            into.append(time.process_time() - t)
    return statistics.median(a), statistics.median(b)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--case", action="append")
    parser.add_argument("--cpu", default=None, help="avx2: as on an AVX2-only Zen 3")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    for key in args.case or list(CASES):
        name, statement, xs, ws, options, conv = CASES[key]
        x = torch.from_numpy(rng.standard_normal(xs, dtype=np.float32))
        w = torch.from_numpy(rng.standard_normal(ws, dtype=np.float32))
        kernel = ef.compile(statement, **options)
        ours_y = kernel(x=x, w=w)
        err = float((ours_y - conv(x, w)).abs().max())
        with torch.no_grad():
            fa, fb = _median_ratio(lambda: kernel(x=x, w=w), lambda: conv(x, w),
                                   args.repeats)
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        dy = torch.from_numpy(rng.standard_normal(tuple(ours_y.shape), dtype=np.float32))

        def step(f):
            def run():
                xg.grad = wg.grad = None
                f(xg, wg).backward(dy)
            return run
        ba, bb = _median_ratio(step(lambda x, w: kernel(x=x, w=w)), step(conv),
                               args.repeats)
        print(f"{name:40s} fwd {fa*1e3:7.2f} / {fb*1e3:7.2f} ms = {fa/fb:5.2f}   "
              f"fwd+bwd {ba*1e3:7.2f} / {bb*1e3:7.2f} ms = {ba/bb:5.2f}   "
              f"(max |err| {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
