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
kernel = ef.compile(statement)
start = time.perf_counter()
D = kernel(w=w, x=x)
first = time.perf_counter() - start          # includes compiling the C kernel (cached)
start = time.perf_counter()
D = kernel(w=w, x=x)
again = time.perf_counter() - start
start = time.perf_counter()
reference = (w * w).sum(0)[:, None] + (x * x).sum(0)[None, :] - 2 * (w.T @ x)
blas = time.perf_counter() - start
print(f"einfuse: first call {first * 1e3:.0f} ms (compile included, cached on disk), "
      f"then {again * 1e3:.1f} ms per call; result {D.shape} {D.dtype}")
print(f"NumPy's BLAS expansion |w|^2 + |x|^2 - 2 w.x: {blas * 1e3:.1f} ms (a different, "
      f"cancellation-prone formula); max relative difference "
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

print("\n--- a program: softmax in three statements ---")
X = rng.standard_normal((3, 5))
P = ef.ein("""
    m[i]   := max[j](X[i,j])
    e[i,j] := exp(X[i,j] - m[i])
    P[i,j] := e[i,j] / sum[k](e[i,k])
""", X=X)
print(P.sum(1))

print("\n--- an einsum string, and what it is in index notation ---")
Q, Kt = rng.standard_normal((2, 4, 3, 8)), rng.standard_normal((2, 5, 3, 8))
print(ef.einsum("bthr,bThr->bhtT", Q, Kt).shape)
print(str(ef.explain("bthr,bThr->bhtT", Q, Kt)).split("\n\n")[0])
