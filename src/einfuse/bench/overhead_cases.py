"""Per-call overhead (issue 11): a 4x4 product, 16 elements per operand, where the time
is all dispatch.  One case per way of calling einfuse, each against what a user of that
framework would otherwise write: NumPy (np.einsum), torch without gradients
(torch.einsum), torch forward and backward (autograd), and JAX under jax.jit
(jax.jit of jnp.einsum).  `einfuse bench --case overhead` runs them."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, Peer, installed, numpy_peer, torch_peer

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


def overhead_cases() -> List[Case]:
    cases = [_numpy_case()]
    if installed("torch"):
        cases += [_torch_case(), _autograd_case()]
    if installed("jax"):
        cases.append(_jax_case())
    return cases
