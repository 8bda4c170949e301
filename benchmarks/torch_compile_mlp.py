"""einfuse inside a torch model, eager and under torch.compile (issue 32, items 1-2).

* the module step: a 2-block MLP (RMSNorm, Linear, GELU, Linear, residual) whose blocks
  are one einfuse program each, forward + backward + zeroing the gradients, as an eager
  module and under ``torch.compile`` (inductor), against its pure-torch twin eager and
  compiled;
* small layers at 256x256 float32 as programs (softmax, layernorm, cross-entropy),
  forward (under no_grad) and forward + backward, against torch eager;
* a Linear layer and ReLU as one statement (``max(x @ W.T + bias, 0)``) at 64x784x256
  and 32x128x128, forward (no_grad) and forward + backward (W and bias learn), against
  torch's addmm + relu.

One thread, CPU time (time.process_time), the contenders interleaved, the median of
several repeats.  ``--before REV`` (default db73c28, main before this work) runs the same
measurements on that revision's src/ too (git archive into a temporary folder), in its
own process, so one run reports the ratios before and after.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/torch_compile_mlp.py \
        [--mlp-only] [--batch 256] [--cpu avx2] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os

from before_after import (interleaved, run_child, source_trees, training_step,
                          without_grad)

B, D, H = 64, 128, 512
N = 256

BLOCK = f"""
r[b] := sqrt(sum[d](X[b,d]**2) / {D} + 0.000001)
n[b,d] := X[b,d] / r[b] * G[d]
h[b,f] := sum[d](n[b,d] * W1[d,f])
g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))
y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])
"""
SOFTMAX = """m[i] := max[j](X[i,j])
e[i,j] := exp(X[i,j] - m[i])
P[i,j] := e[i,j] / sum[k](e[i,k])"""
LAYERNORM = f"""mu[i] := sum[j](X[i,j]) / {N}
v[i] := sum[j]((X[i,j] - mu[i])**2) / {N}
y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]"""
CROSS_ENTROPY = f"""m[i] := max[j](X[i,j])
l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]
L := sum[i](l[i]) / {N}"""
LINEAR_RELU = "y[b,o] := max(sum[i](x[b,i]*W[o,i]) + bias[o], 0)"
LINEAR_SHAPES = ((64, 784, 256), (32, 128, 128))


def contenders(compile_models: bool, mlp_only: bool = False, batch: int = B):
    """name -> (group, callable): each group's first entry is einfuse's; ``batch``: the
    module step's rows."""
    import torch
    import einfuse as ef
    from einfuse.backends.c import torch_node
    torch.set_num_threads(1)
    torch.manual_seed(0)
    torch_node.module(wait=True)     # (the C++ node loaded before anything is timed)
    program = ef.compile(BLOCK, outputs=("y",))

    class Block(torch.nn.Module):
        def __init__(self, ours):
            super().__init__()
            self.ours = ours
            self.G = torch.nn.Parameter(torch.ones(D))
            self.W1 = torch.nn.Parameter(torch.randn(D, H) / D ** 0.5)
            self.W2 = torch.nn.Parameter(torch.randn(H, D) / H ** 0.5)

        def forward(self, x):
            if self.ours:
                return program(X=x, G=self.G, W1=self.W1, W2=self.W2)
            r = torch.sqrt((x * x).mean(1, keepdim=True) + 1e-6)
            return x + torch.nn.functional.gelu((x / r * self.G) @ self.W1) @ self.W2

    class MLP(torch.nn.Module):
        def __init__(self, ours):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(ours), Block(ours)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x.square().mean()

    ours, twin = MLP(True), MLP(False)
    twin.load_state_dict(ours.state_dict())
    rows = torch.randn(batch, D)

    def step(model):
        def run():
            for p in model.parameters():
                p.grad = None
            model(rows).backward()
        return run
    found = {"mlp: einfuse eager": ("mlp", step(ours)),
             "mlp: torch eager": ("mlp", step(twin))}
    if compile_models:
        found["mlp: einfuse compiled"] = ("mlp", step(torch.compile(ours)))
        found["mlp: torch compiled"] = ("mlp", step(torch.compile(twin)))
    if mlp_only:
        return found

    X = torch.randn(N, N, requires_grad=True)
    g = torch.randn(N, requires_grad=True)
    b = torch.randn(N, requires_grad=True)
    t = torch.randint(0, N, (N,))
    seed = torch.randn(N, N)
    softmax, layernorm = ef.compile(SOFTMAX), ef.compile(LAYERNORM)
    cross_entropy = ef.compile(CROSS_ENTROPY)
    layers = {
        "softmax": (lambda: softmax(X=X), lambda: torch.softmax(X, 1), seed),
        "layernorm": (lambda: layernorm(X=X, g=g, b=b),
                      lambda: torch.nn.functional.layer_norm(X, (N,), g, b), seed),
        "cross-entropy": (lambda: cross_entropy(X=X, t=t),
                          lambda: torch.nn.functional.cross_entropy(X, t), None)}
    leaves = {name: (X, g, b) for name in layers}
    linear = ef.compile(LINEAR_RELU)
    for batch, inner, outer in LINEAR_SHAPES:
        x = torch.randn(batch, inner)
        W = (torch.randn(outer, inner) / inner ** 0.5).requires_grad_()
        bias = torch.randn(outer, requires_grad=True)
        name = f"linear+relu {batch}x{inner}x{outer}"
        layers[name] = (lambda x=x, W=W, bias=bias: linear(x=x, W=W, bias=bias),
                        lambda x=x, W=W, bias=bias: torch.relu(torch.addmm(bias, x, W.T)),
                        torch.randn(batch, outer))
        leaves[name] = (W, bias)
    for name, (mine, peer, weight) in layers.items():
        found[f"{name} fwd: einfuse"] = (f"{name} fwd", without_grad(mine))
        found[f"{name} fwd: torch eager"] = (f"{name} fwd", without_grad(peer))
        found[f"{name} fwd+bwd: einfuse"] = (f"{name} fwd+bwd",
                                            training_step(mine, weight, leaves[name]))
        found[f"{name} fwd+bwd: torch eager"] = (f"{name} fwd+bwd",
                                                 training_step(peer, weight, leaves[name]))
    return found


def measure(repeats: int, calls: int, compile_models: bool, mlp_only: bool,
            batch: int) -> dict:
    return interleaved(contenders(compile_models, mlp_only, batch), repeats, calls)


def report(label: str, results: dict) -> None:
    print(f"\n== {label} (median CPU time per call; and as a multiple of "
          "the group's einfuse entry)")
    groups = {}
    for name, row in results.items():
        groups.setdefault(row["group"], []).append((name, row))
    for group, rows in groups.items():
        reference = rows[0][1]["seconds"]
        for name, row in rows:
            print(f"  {name:32s} {row['seconds'] * 1e6:9.1f} us   "
                  f"{row['seconds'] / reference:5.2f}x of einfuse's"
                  f"   (first call {row['first']:.2f} s)")


def ratios(results: dict) -> dict:
    """Ratios the issue states: the peer's time over einfuse's (>= 1: einfuse faster)."""
    def t(name):
        return results[name]["seconds"] if name in results else float("nan")
    found = {"compiled einfuse / eager einfuse (time)":
             t("mlp: einfuse compiled") / t("mlp: einfuse eager"),
             "torch eager / einfuse eager (module step)":
             t("mlp: torch eager") / t("mlp: einfuse eager"),
             "torch compiled / einfuse compiled (module step)":
             t("mlp: torch compiled") / t("mlp: einfuse compiled")}
    for layer in ("softmax", "layernorm", "cross-entropy") + tuple(
            f"linear+relu {b}x{i}x{o}" for b, i, o in LINEAR_SHAPES):
        for kind in ("fwd", "fwd+bwd"):
            found[f"torch eager / einfuse: {layer} {kind}"] = \
                t(f"{layer} {kind}: torch eager") / t(f"{layer} {kind}: einfuse")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--before", default="db73c28",
                        help="a git revision to measure too ('' for none)")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the torch.compile contenders")
    parser.add_argument("--mlp-only", action="store_true",
                        help="only the module step (eager and compiled, einfuse and torch)")
    parser.add_argument("--batch", type=int, default=B,
                        help="the module step's batch (rows of X)")
    parser.add_argument("--cpu", default=None,
                        help="EINFUSE_CPU target; avx2 also puts torch's kernels, its "
                             "GEMMs and inductor's code on AVX2")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpu:                  # (the children inherit the environment)
        os.environ["EINFUSE_CPU"] = args.cpu
        if args.cpu == "avx2":
            os.environ["ATEN_CPU_CAPABILITY"] = "avx2"
            os.environ["MKL_ENABLE_INSTRUCTIONS"] = "AVX2"
            os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"
    # each tree traces and compiles its own graphs: inductor's caches, shared by
    # processes, would hand one tree's compiled graph (the operators' kept values)
    # to the other
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    if args.child:
        print(json.dumps(measure(args.repeats, args.calls, not args.no_compile,
                                 args.mlp_only, args.batch)))
        return
    arguments = ["--repeats", str(args.repeats), "--calls", str(args.calls),
                 "--batch", str(args.batch)] + \
        (["--no-compile"] if args.no_compile else []) + \
        (["--mlp-only"] if args.mlp_only else [])
    with source_trees(args.before) as trees:
        runs = {label: run_child(__file__, src, arguments) for label, src in trees.items()}
    for label, results in runs.items():
        report(label, results)
    print("\n== ratios (one thread, CPU time)")
    table = {label: ratios(results) for label, results in runs.items()}
    labels = list(table)
    print(f"  {'':52s}" + "".join(f"{label:>22s}" for label in labels))
    for key in table[labels[0]]:
        if all(table[label][key] != table[label][key] for label in labels):
            continue        # (a group not measured: --mlp-only)
        print(f"  {key:52s}" + "".join(f"{table[label][key]:22.2f}" for label in labels))


if __name__ == "__main__":
    main()
