"""Per-call cost of small layers that gather (issue 32, item 2): cross-entropy
(``X[i, t[i]]``) at 256x256 float32 and an embedding lookup followed by an RMS norm
(256 ids into a 1000x256 table), repeated calls on torch tensors (forward under
no_grad, and forward + backward) and on NumPy arrays (forward), against torch eager.

One thread, CPU time (time.process_time), the contenders interleaved, the median of
several repeats.  ``--before REV`` (default main) runs the same measurements on that
revision's src/ too (git archive into a temporary folder) in its own process, so one run
reports the ratios before and after.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/gather_layers.py
"""

from __future__ import annotations

import argparse
import json

from before_after import (interleaved, run_child, source_trees, training_step,
                          without_grad)

N, ROWS = 256, 1000
CROSS_ENTROPY = f"""m[i] := max[j](X[i,j])
l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]
L := sum[i](l[i]) / {N}"""
EMBED_NORM = f"""h[b,d] := E[ids[b], d] * s[d]
r[b] := sqrt(sum[d](h[b,d]**2) / {N} + 0.000001)
y[b,d] := h[b,d] / r[b]"""


def contenders() -> dict:
    """name -> (group, callable); each group's first entry is einfuse's."""
    import numpy as np
    import torch
    import einfuse as ef
    torch.set_num_threads(1)
    torch.manual_seed(0)
    X = torch.randn(N, N, requires_grad=True)
    t = torch.randint(0, N, (N,))
    E = torch.randn(ROWS, N, requires_grad=True)
    s = torch.randn(N, requires_grad=True)
    ids = torch.randint(0, ROWS, (N,))
    seed = torch.randn(N, N)
    Xn, tn = X.detach().numpy().copy(), t.numpy().copy()
    En, sn, idsn = E.detach().numpy().copy(), s.detach().numpy().copy(), ids.numpy().copy()
    cross_entropy, embed_norm = ef.compile(CROSS_ENTROPY), ef.compile(EMBED_NORM)

    def twin_embed():
        h = E[ids] * s
        return h * torch.rsqrt((h * h).mean(1, keepdim=True) + 1e-6)
    layers = {"cross-entropy": (lambda: cross_entropy(X=X, t=t),
                                lambda: torch.nn.functional.cross_entropy(X, t),
                                lambda: cross_entropy(X=Xn, t=tn), None),
              "embed+rmsnorm": (lambda: embed_norm(E=E, ids=ids, s=s), twin_embed,
                                lambda: embed_norm(E=En, ids=idsn, s=sn), seed)}

    found = {}
    for name, (mine, peer, numpy_call, weight) in layers.items():
        found[f"{name} fwd: einfuse"] = (f"{name} fwd", without_grad(mine))
        found[f"{name} fwd: torch eager"] = (f"{name} fwd", without_grad(peer))
        found[f"{name} fwd: einfuse numpy"] = (f"{name} fwd", numpy_call)
        found[f"{name} fwd+bwd: einfuse"] = (f"{name} fwd+bwd",
                                            training_step(mine, weight, (X, E, s)))
        found[f"{name} fwd+bwd: torch eager"] = (f"{name} fwd+bwd",
                                                 training_step(peer, weight, (X, E, s)))
    # checked against torch first
    with torch.no_grad():
        assert np.allclose(float(layers["cross-entropy"][0]()),
                           float(layers["cross-entropy"][1]()), rtol=1e-5)
        assert np.allclose(layers["embed+rmsnorm"][2](), twin_embed().numpy(),
                           rtol=1e-4, atol=1e-5)
    return found


def measure(repeats: int, calls: int) -> dict:
    return interleaved(contenders(), repeats, calls, warm=5)


def report(label: str, results: dict) -> None:
    print(f"\n== {label} (median CPU time per call; torch eager's time over each entry's:"
          " >= 1 is einfuse as fast or faster)")
    groups = {}
    for name, row in results.items():
        groups.setdefault(row["group"], []).append((name, row))
    for group, rows in groups.items():
        peer = next(row["seconds"] for name, row in rows if name.endswith("torch eager"))
        for name, row in rows:
            print(f"  {name:34s} {row['seconds'] * 1e6:9.1f} us   "
                  f"torch/this {peer / row['seconds']:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--before", default="main",
                        help="a git revision to measure too ('' for none)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.repeats, args.calls)))
        return
    arguments = ["--repeats", str(args.repeats), "--calls", str(args.calls)]
    with source_trees(args.before) as trees:
        runs = {label: run_child(__file__, src, arguments) for label, src in trees.items()}
    for label, results in runs.items():
        report(label, results)


if __name__ == "__main__":
    main()
