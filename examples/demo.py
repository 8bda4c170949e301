"""einfuse in one minute: the main job on real sizes, then explain."""

import time

import numpy as np

import einfuse as ef

rng = np.random.default_rng(0)
K, N, M = 784, 512, 512
w = rng.standard_normal((K, N)).astype(np.float32)
x = rng.standard_normal((K, M)).astype(np.float32)

statement = "D[i,j] := (w[k,i] - x[k,j])**2"
print(f"statement: {statement}   (K={K}, N={N}, M={M}, float32)\n")
start = time.perf_counter()
D = ef.ein(statement, w=w, x=x)
elapsed = time.perf_counter() - start
reference = (w * w).sum(0)[:, None] + (x * x).sum(0)[None, :] - 2 * (w.T @ x)
print(f"einfuse: {elapsed * 1e3:.0f} ms, result {D.shape} {D.dtype}, "
      f"max relative difference to the BLAS expansion "
      f"{np.max(np.abs(D - reference) / np.abs(reference)):.1e}")
explanation = ef.explain(statement, w=w, x=x)
print(f"a broadcast (w[:, :, None] - x[:, None, :])**2 would allocate "
      f"{explanation.naive_intermediate_bytes / 1e9:.2f} GB; einfuse did not.\n")
print(explanation)

print("\n--- a convolution, ranges inferred ---")
signal, kernel = np.arange(10.0), np.array([1.0, 0.0, -1.0])
print(ef.ein("y[i] := x[i+a] * ker[a]", x=signal, ker=kernel))

print("\n--- an embedding gather with a bounds policy ---")
table, tokens = np.arange(12.0).reshape(4, 3), np.array([3, 0, 7])
print(ef.ein("E[b,d] := W[idx[b], d]", W=table, idx=tokens, bounds="clip"))
try:
    ef.ein("E[b,d] := W[idx[b], d]", W=table, idx=tokens)
except ef.EinfuseError as error:
    print(f"\nwith the default bounds='check':\n{error}")
