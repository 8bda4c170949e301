"""Per-call overhead (issue 11): a 4x4 product, 16 elements per operand, where the time
is all dispatch.  One case per way of calling einfuse, each against what a user of that
framework would otherwise write: NumPy (np.einsum), torch without gradients
(torch.einsum), torch forward and backward (autograd), and JAX under jax.jit
(jax.jit of jnp.einsum).  And a gather right after a BLAS call against np.take, and an
embedding + RMS norm program's forward + backward against torch eager.
`einfuse bench --case overhead` runs them."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, Peer, installed, numpy_peer, torch_peer, training_case

STATEMENT = "C[i,j] := A[i,k] * B[k,j]"


def _inputs(rng):
    return {"A": rng.standard_normal((4, 4)), "B": rng.standard_normal((4, 4))}


def _numpy_case() -> Case:
    def ours(arrays, backend):
        import einfuse as ef
        kernel = ef.compile(STATEMENT, backend=backend)
        return lambda: kernel(**arrays)
    return Case("overhead numpy 4x4", STATEMENT, _inputs,
                [numpy_peer("np.einsum", lambda A, B: np.einsum("ik,kj->ij", A, B))],
                einfuse_call=ours)


def _torch_case() -> Case:
    def ours(arrays, backend):
        import torch

        import einfuse as ef
        kernel = ef.compile(STATEMENT, backend=backend)
        tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
        return lambda: kernel(**tensors)

    def einsum(A, B):
        import torch
        return torch.einsum("ik,kj->ij", A, B)
    return Case("overhead torch 4x4", STATEMENT, _inputs,
                [torch_peer("torch.einsum", einsum)], einfuse_call=ours)


def _step(fn, tensors):
    for tensor in tensors.values():
        tensor.grad = None
    out = fn(**tensors)
    out.sum().backward()
    return tensors["A"].grad


def _leaves(arrays):
    import torch
    return {k: torch.from_numpy(v.copy()).requires_grad_(True) for k, v in arrays.items()}


def _autograd_case() -> Case:
    def ours(arrays, backend):
        import einfuse as ef
        kernel = ef.compile(STATEMENT, backend=backend)
        tensors = _leaves(arrays)
        return lambda: _step(kernel, tensors)

    def torch_autograd(arrays):
        tensors = _leaves(arrays)
        return lambda: _step(lambda A, B: A @ B, tensors)
    return Case("overhead torch fwd+bwd 4x4", STATEMENT, _inputs,
                [Peer("torch autograd", torch_autograd, "torch")], einfuse_call=ours)


def _jax_case() -> Case:
    def ours(arrays, backend):
        import jax
        import jax.numpy as jnp

        import einfuse as ef
        values = {k: jnp.asarray(v) for k, v in arrays.items()}
        jitted = jax.jit(lambda A, B: ef.ein(STATEMENT, A=A, B=B, backend=backend))
        return lambda: jitted(**values).block_until_ready()

    def jax_einsum(arrays):
        import jax
        import jax.numpy as jnp
        values = {k: jnp.asarray(v) for k, v in arrays.items()}
        jitted = jax.jit(lambda A, B: jnp.einsum("ik,kj->ij", A, B))
        return lambda: jitted(**values).block_until_ready()
    return Case("overhead jax.jit 4x4", STATEMENT, _inputs,
                [Peer("jax.jit(jnp.einsum)", jax_einsum, "jax")], einfuse_call=ours)


GATHER = "E[b,d] := W[idx[b], d]"


def _after_blas(call, product):
    """``call`` with a BLAS call before each timed run (bench/runner.py's ``before``)."""
    call.before = product
    return call


def gather_after_blas_case(B: int, V: int = 50000, D: int = 256, n: int = 512) -> Case:
    """An embedding lookup right after a large matmul (n x n x n float32, NumPy's BLAS,
    untimed), whose threads may still be spinning when the gather starts: einfuse
    (and einfuse with threads=1) against np.take after the same matmul."""
    def inputs(rng):
        return {"W": rng.standard_normal((V, D), dtype=np.float32),
                "idx": rng.integers(0, V, B).astype(np.int64)}
    square = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)

    def product():
        return square @ square

    def ours(arrays, backend, threads=None):
        import einfuse as ef
        kernel = ef.compile(GATHER, backend=backend, threads=threads)
        return _after_blas(lambda: kernel(**arrays), product)

    def take(arrays):
        W, idx = arrays["W"], arrays["idx"]
        return _after_blas(lambda: np.take(W, idx, axis=0), product)
    return Case(f"overhead gather after BLAS B={B} D={D}", GATHER, inputs,
                [Peer("np.take", take),
                 Peer("einfuse threads=1", lambda arrays: ours(arrays, "auto", 1))],
                einfuse_call=ours)


EMBED_NORM = """h[b,d] := E[ids[b], d] * s[d]
r[b] := sqrt(sum[d](h[b,d]**2) / 256 + 0.000001)
y[b,d] := h[b,d] / r[b]"""


def embed_norm_case(ids: int = 256, rows: int = 1000) -> Case:
    """An embedding lookup and an RMS norm as one program (issue 32's small layers),
    forward + backward on torch tensors: the backward's row scatter into the table is
    per-call cost at this size."""
    def inputs(rng):
        return {"E": rng.standard_normal((rows, 256), dtype=np.float32),
                "ids": rng.integers(0, rows, ids).astype(np.int64),
                "s": rng.standard_normal(256, dtype=np.float32)}

    def formula(E, ids, s):
        import torch
        h = E[ids] * s
        return h * torch.rsqrt((h * h).mean(1, keepdim=True) + 1e-6)
    return training_case(f"embedding+rmsnorm program {ids}x256", EMBED_NORM, inputs,
                         formula, compiled=False)


def overhead_cases() -> List[Case]:
    cases = [_numpy_case(), gather_after_blas_case(2048), gather_after_blas_case(16384)]
    if installed("torch"):
        cases += [_torch_case(), _autograd_case(), embed_norm_case()]
    if installed("jax"):
        cases.append(_jax_case())
    return cases
