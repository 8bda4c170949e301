"""Statements with jax.numpy formulations of them, shared by the JAX tests (the host
path in test_jax.py, the device path in test_jax_gpu.py)."""

import jax
import jax.numpy as jnp
import numpy as np

# The references' float32 products in full float32: on a GPU, XLA's default is TF32
# (about 1e-3 relative), which einfuse's kernels do not use (seen on an H100).
jax.config.update("jax_default_matmul_precision", "highest")

rng = np.random.default_rng(0)


def r(*shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


CASES = [
    ("C[i,j] := A[i,k] * B[k,j]", lambda A, B: A @ B, {"A": r(3, 4), "B": r(4, 2)}),
    ("D[i,j] := (w[k,i] - x[k,j])**2",
     lambda w, x: ((w[:, :, None] - x[:, None, :]) ** 2).sum(0), {"w": r(5, 3), "x": r(5, 4)}),
    ("y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]", lambda x, W, bias: x @ W + bias,
     {"x": r(2, 3), "W": r(3, 4), "bias": r(4)}),
    ("y[i] := x[i+a] * ker[a]",
     lambda x, ker: jnp.stack([x[i:i + 3] @ ker for i in range(7)]), {"x": r(9), "ker": r(3)}),
    ("o[i] := sum[j](exp(-sum[d]((x[i,d]-y[j,d])**2)) * b[j])",
     lambda x, y, b: (jnp.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) * b).sum(1),
     {"x": r(4, 3), "y": r(5, 3), "b": r(5)}),
    ("z[i] := logsumexp[j](X[i,j])", lambda X: jax.nn.logsumexp(X, axis=1), {"X": r(3, 6)}),
    ("s := alpha * x[i]**2", lambda alpha, x: alpha * (x ** 2).sum(),
     {"alpha": jnp.float32(0.7), "x": r(6)}),
]
IDS = [c[0] for c in CASES]


def loss_of(fn):
    return lambda *values: jnp.sum(jnp.sin(fn(*values)))
