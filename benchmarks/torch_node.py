"""The C++ autograd node (runtime/torch_node.py) against the Python autograd path it
replaces and torch eager: the training step (forward + backward) and the forward of
softmax, layernorm and cross-entropy programs at 256x256 float32, of a Linear layer and
ReLU as a two-statement program (its product and its gradients' products node
operations: runtime/torch_node_products.py) at 64x784x256 and 32x128x128, and of the
2-block MLP module (bench/module_cases.py), one thread, CPU time, interleaved, medians.

    PYTHONPATH=src python benchmarks/torch_node.py [repeats]"""

import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.c import torch_node  # noqa: E402
from einfuse.bench.module_cases import CROSS_ENTROPY, _mlp, _mlp_inputs  # noqa: E402

torch.set_num_threads(1)
N = 256
SOFTMAX = ("M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\n"
           "Z[i] := sum[j](E[i,j])\nP[i,j] := E[i,j] / Z[i]")
LAYERNORM = (f"m[i] := sum[j](X[i,j]) / {N}\nv[i] := sum[j]((X[i,j] - m[i])**2) / {N}\n"
             f"Y[i,j] := (X[i,j] - m[i]) / sqrt(v[i] + 1e-05) * g[j] + b[j]")
LINEAR_RELU = "h[b,o] := sum[i](x[b,i] * W[o,i]) + c[o]\ny[b,o] := max(h[b,o], 0)"


def python_path(holder):
    """``holder``'s prepared calls kept on the Python autograd path."""
    for owner in holder.__dict__.get("_autograd", {}).values():
        for call in owner.calls.values():
            call._node, call._node_tried = None, True


def node_in_use(holder) -> bool:
    return any(getattr(call, "_node", None) is not None
               for owner in holder.__dict__.get("_autograd", {}).values()
               for call in owner.calls.values())


def layer_steps():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((N, N), dtype=np.float32)).requires_grad_()
    g = torch.from_numpy(rng.standard_normal(N, dtype=np.float32)).requires_grad_()
    b = torch.from_numpy(rng.standard_normal(N, dtype=np.float32)).requires_grad_()
    t = torch.from_numpy(rng.integers(0, N, N))
    seed = torch.from_numpy(rng.standard_normal((N, N), dtype=np.float32))
    F = torch.nn.functional
    cases = {
        "softmax": (SOFTMAX, ("P",), dict(X=x), lambda: torch.softmax(x, 1), seed),
        "layernorm": (LAYERNORM, ("Y",), dict(X=x, g=g, b=b),
                      lambda: F.layer_norm(x, (N,), g, b, 1e-5), seed),
        # only the gain learns: dg's column sum runs alone in its hoisted form (the
        # node took it only once that form was prepared for its stand-ins, not in a
        # fresh process, before); another text, so another program
        "layernorm, gain only": (LAYERNORM + "\n\n", ("Y",),
                                 dict(X=x.detach(), g=g, b=b.detach()),
                                 lambda: F.layer_norm(x.detach(), (N,), g, b.detach(), 1e-5),
                                 seed),
        "cross-entropy": (CROSS_ENTROPY.replace("N", str(N)), ("L",), dict(X=x, t=t),
                          lambda: F.cross_entropy(x, t), None),
    }
    leaves = {name: (x, g, b) for name in cases}
    for batch, inner, outer in ((64, 784, 256), (32, 128, 128)):
        xs = torch.from_numpy(rng.standard_normal((batch, inner), dtype=np.float32))
        W = torch.from_numpy(rng.standard_normal((outer, inner), dtype=np.float32) /
                             inner ** 0.5).requires_grad_()
        c = torch.from_numpy(rng.standard_normal(outer, dtype=np.float32)).requires_grad_()
        name = f"linear+relu {batch}x{inner}x{outer}"
        cases[name] = (LINEAR_RELU, ("y",), dict(x=xs, W=W, c=c),
                       lambda xs=xs, W=W, c=c: torch.relu(F.linear(xs, W, c)),
                       torch.from_numpy(rng.standard_normal((batch, outer),
                                                            dtype=np.float32)))
        leaves[name] = (W, c)
    found = {}
    for name, (text, outputs, env, twin, seed_of) in cases.items():
        made = {}
        for form in ("python", "node"):
            # (another text for each form: ef.compile gives one program per text)
            program = ef.compile(text + ("\n" if form == "python" else ""), outputs=outputs)
            made[form] = program
            for _ in range(3):
                out = program(**env)
                out.backward(seed_of if seed_of is not None else None)
                if form == "python":
                    python_path(program)

        def train(fn, seed=seed_of, zeroed=leaves[name]):
            def step():
                for v in zeroed:
                    v.grad = None
                out = fn()
                out.backward(seed) if seed is not None else out.backward()
            return step
        found[name] = {
            "torch": (train(twin), twin),
            "python": (train(lambda p=made["python"], e=env: p(**e)),
                       lambda p=made["python"], e=env: p(**e)),
            "node": (train(lambda p=made["node"], e=env: p(**e)),
                     lambda p=made["node"], e=env: p(**e)),
            "in use": node_in_use(made["node"]),
        }
    return found


def module_steps():
    """The MLP's training step, torch's twin and einfuse's blocks (whatever path they
    take: the node where their steps translate)."""
    arrays = _mlp_inputs(64, 128, 512)(np.random.default_rng(0))
    x = torch.from_numpy(arrays["X"])
    models = {"torch": _mlp(arrays, False), "einfuse": _mlp(arrays, True)}

    def step_of(model):
        def step():
            for p in model.parameters():
                p.grad = None
            model(x).backward()
        return step
    steps = {k: step_of(m) for k, m in models.items()}
    for _ in range(3):
        for step in steps.values():
            step()
    return steps


def timed(fn, inner: int) -> float:
    start = time.process_time()
    for _ in range(inner):
        fn()
    return (time.process_time() - start) / inner * 1e6


def main(repeats: int = 9, inner: int = 100):
    torch_node.module(wait=True)
    print(f"node: {torch_node.reason()}; {N}x{N} float32, one thread, CPU time, "
          f"median of {repeats} interleaved rounds of {inner} calls")
    layers = layer_steps()
    for name, forms in layers.items():
        for kind, index in (("fwd+bwd", 0), ("fwd", 1)):
            fns = {f: forms[f][index] for f in ("torch", "python", "node")}
            times = {f: [] for f in fns}
            for _ in range(repeats):
                for f, fn in fns.items():
                    times[f].append(timed(fn, inner))
            med = {f: float(np.median(v)) for f, v in times.items()}
            print(f"{name:26s} {kind:8s} torch {med['torch']:7.1f} us  python path "
                  f"{med['python']:7.1f} ({med['python'] / med['torch']:.2f}x)  node "
                  f"{med['node']:7.1f} ({med['node'] / med['torch']:.2f}x)"
                  f"{'' if forms['in use'] else '  [node not used: Python path]'}")
    steps = module_steps()
    times = {f: [] for f in steps}
    for _ in range(repeats):
        for f, fn in steps.items():
            times[f].append(timed(fn, max(inner // 10, 5)))
    med = {f: float(np.median(v)) for f, v in times.items()}
    print(f"module step (MLP b=64 d=128 h=512) torch {med['torch']:7.1f} us  einfuse "
          f"{med['einfuse']:7.1f} ({med['einfuse'] / med['torch']:.2f}x)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
