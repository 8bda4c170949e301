"""A program's gradient under jax.jit(jax.grad(loss)) through einfuse against pure
jax.numpy (issue 32, item 4): softmax and layernorm at 256x256 and 2048x1024, the MLP
block of benchmarks/torch_compile_mlp.py (b=64 d=128 h=512), float32.

Contenders, interleaved in one process, one thread (OMP_NUM_THREADS=1, XLA's CPU
client on one thread), CPU time (time.process_time), medians of REPEATS:
  before: the backward's statements each one custom call (runtime/jax_program's
          run_kernels replaced by run_statements, as before runtime/jax_groups.py);
  after:  the backward's fusion groups, each one custom call;
  jnp:    jax.grad of the jax.numpy formulation.

Run: PYTHONPATH=src python benchmarks/jax_program_backward.py [--repeats 7]"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                      "intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.runtime import jax_program  # noqa: E402
from einfuse.runtime.run_groups import run_statements  # noqa: E402

SOFTMAX = """m[i] := max[j](X[i,j])
e[i,j] := exp(X[i,j] - m[i])
P[i,j] := e[i,j] / sum[k](e[i,k])"""
LAYERNORM = """mu[i] := sum[j](X[i,j]) / {n}
v[i] := sum[j]((X[i,j] - mu[i])**2) / {n}
y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]"""
B, D, H = 64, 128, 512
BLOCK = f"""r[b] := sqrt(sum[d](X[b,d]**2) / {D} + 0.000001)
n[b,d] := X[b,d] / r[b] * G[d]
h[b,f] := sum[d](n[b,d] * W1[d,f])
g[b,f] := 0.5 * h[b,f] * (1 + erf(h[b,f] * 0.7071067811865476))
y[b,e] := X[b,e] + sum[f](g[b,f] * W2[f,e])"""


def _layernorm(X, g, b):
    mu = X.mean(1, keepdims=True)
    return (X - mu) / jnp.sqrt(((X - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b


def _block(X, G, W1, W2):
    n = X / jnp.sqrt((X ** 2).sum(1, keepdims=True) / D + 1e-6) * G
    h = n @ W1
    return X + (0.5 * h * (1 + jax.scipy.special.erf(h * 0.7071067811865476))) @ W2


def cases():
    """name -> (program text, input names, shapes, jax.numpy formulation)."""
    found = {}
    for rows, cols in ((256, 256), (2048, 1024)):
        found[f"softmax {rows}x{cols}"] = (SOFTMAX, ("X",), [(rows, cols)],
                                          lambda X: jax.nn.softmax(X, axis=1))
        found[f"layernorm {rows}x{cols}"] = (LAYERNORM.format(n=cols), ("X", "g", "b"),
                                            [(rows, cols), (cols,), (cols,)], _layernorm)
    found[f"mlp block {B}x{D}x{H}"] = (BLOCK, ("X", "G", "W1", "W2"),
                                      [(B, D), (D,), (D, H), (H, D)], _block)
    return found


def _loss(f, weights):
    return lambda *values: (f(*values) * weights).sum()


def _einfuse(source, names):
    program = ef.compile(source)
    program.__dict__.pop("_jax_rules", None)     # its backward planned afresh
    return lambda *values: program(**dict(zip(names, values)))


def _grad(f, weights, arrays):
    function = jax.jit(jax.grad(_loss(f, weights), tuple(range(len(arrays)))))
    compiled = function.lower(*arrays).compile()
    calls = len(re.findall(r'custom_call_target="einfuse_', compiled.as_text()))
    jax.block_until_ready(compiled(*arrays))
    return compiled, calls


def _statements_alone(kernels, env, keep):
    run_statements(kernels, env, "jax", keep=keep)


def _time(function, arrays, count: int) -> float:
    start = time.process_time()
    for _ in range(count):
        out = function(*arrays)
    jax.block_until_ready(out)
    return (time.process_time() - start) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}; jax {jax.__version__}; one thread; "
          f"us per jit(grad) call, CPU time, median of {args.repeats}")
    rng = np.random.default_rng(0)
    for name, (source, names, shapes, formula) in cases().items():
        if args.only and args.only not in name:
            continue
        arrays = [jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.5)
                  for s in shapes]
        out_shape = (shapes[0][0], shapes[-1][-1] if "mlp" in name else shapes[0][1])
        weights = jnp.asarray(rng.standard_normal(out_shape).astype(np.float32))
        real = jax_program.run_kernels
        jax_program.run_kernels = _statements_alone
        try:
            before, before_calls = _grad(_einfuse(source, names), weights, arrays)
        finally:
            jax_program.run_kernels = real
        after, after_calls = _grad(_einfuse(source, names), weights, arrays)
        ours_jnp, _ = _grad(formula, weights, arrays)
        np.testing.assert_allclose(np.asarray(after(*arrays)[0]),
                                   np.asarray(ours_jnp(*arrays)[0]), rtol=2e-3, atol=2e-4)
        size = int(np.prod(shapes[0]))
        count = max(3, min(200, int(4e7 // (size * 40))))
        times = {"before": [], "after": [], "jnp": []}
        for _ in range(args.repeats):
            for label, function in (("before", before), ("after", after),
                                    ("jnp", ours_jnp)):
                times[label].append(_time(function, arrays, count))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name:24s} before {med['before']:9.1f} ({before_calls} calls)  "
              f"after {med['after']:9.1f} ({after_calls} calls)  jnp {med['jnp']:9.1f}  "
              f"before/after {med['before'] / med['after']:.2f}  "
              f"jnp/before {med['jnp'] / med['before']:.2f}  "
              f"jnp/after {med['jnp'] / med['after']:.2f}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
