"""JAX gradients of gathers (issue 32): ``jax.grad`` of an embedding lookup under
``vmap`` (Equinox #920's ``weight[x]`` per sequence, the table shared), inside
``jax.jit``, through ``ef.ein`` (runtime/jax_scatter_grad.py), through ``ef.jit`` of the
vmapped lookup and through ``jax.vmap`` of an ``ef.jit`` lookup, against
``jax.jit(jax.grad(...))`` of the plain function.  ``einfuse bench --case "gather
gradient"`` runs them; benchmarks/jax_gather_grad.py times them all in one run."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, Peer

ROUTES = ("ef.ein", "ef.jit", "vmap(ef.jit)")


def gather_inputs(V: int, D: int, B: int, T: int):
    def inputs(rng):
        return {"W": rng.standard_normal((V, D)).astype(np.float32),
                "ids": rng.integers(0, V, (B, T)).astype(np.int32),
                "G": rng.standard_normal((B, T, D)).astype(np.float32)}
    return inputs


def gradient(route: str):
    """The loss's gradient with respect to the table, written with ``route`` (or
    ``"jax"``: plain ``jax.numpy``); a function of (W, ids, G)."""
    import jax
    import jax.numpy as jnp

    import einfuse as ef

    def look(W, ids):
        return W[ids]
    shared = (None, 0)
    if route == "jax":
        lookup = jax.vmap(look, in_axes=shared)
    elif route == "ef.ein":
        def lookup(W, ids):
            return jax.vmap(lambda W, row: ef.ein("e[t, d] := W[idx[t], d]", W=W, idx=row),
                            in_axes=shared)(W, ids)
    elif route == "ef.jit":
        lookup = ef.jit(jax.vmap(look, in_axes=shared))
    else:
        lookup = jax.vmap(ef.jit(look), in_axes=shared)
    return jax.grad(lambda W, ids, G: jnp.sum(lookup(W, ids) * G))


def _jitted(route: str):
    def make(arrays, backend=None):
        import jax
        import jax.numpy as jnp
        fn = jax.jit(gradient(route))
        values = [jnp.asarray(arrays[k]) for k in ("W", "ids", "G")]
        jax.block_until_ready(fn(*values))
        return lambda: jax.block_until_ready(fn(*values))
    return make


def gather_grad_case(V: int = 10000, D: int = 64, B: int = 64, T: int = 64,
                     route: str = "ef.ein") -> Case:
    return Case(f"gather gradient under vmap, {route}, V={V} D={D} B={B} T={T}",
                "jax.jit(jax.grad(sum(vmap(W[ids]) * G)))", gather_inputs(V, D, B, T),
                [Peer("jax.jit", _jitted("jax"), "jax")], einfuse_call=_jitted(route))


def gather_grad_cases(quick: bool = False) -> List[Case]:
    sizes = (1000, 32, 16, 16) if quick else (10000, 64, 64, 64)
    return [gather_grad_case(*sizes, route=route) for route in ROUTES]


__all__ = ["gather_grad_case", "gather_grad_cases", "gradient", "ROUTES"]
