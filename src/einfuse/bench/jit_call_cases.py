"""Per-call cost of an ``ef.jit`` function called inside ``jax.jit`` (issue 12): the
seed's MLP over a few scan steps, small enough that the call is all dispatch, and its
gradient; einfuse's XLA FFI custom call against the same kernel through the host
callback (``EINFUSE_JIT_CALLBACK=1`` while it is lowered) and against ``jax.jit`` of
the plain function.  ``einfuse bench --case "ef.jit call"`` runs them."""

from __future__ import annotations

import os
from typing import List

from .cases import Case, Peer
from .jit_cases import seed_function, seed_inputs


def _jitted(kind: str, callback: bool = False, plain: bool = False):
    """The timed call: jax.jit of the (ef.jit-compiled, unless ``plain``) seed function
    or of its gradient, lowered and run once here (the route is fixed at lowering)."""
    def make(arrays, backend=None):
        import jax
        import jax.numpy as jnp

        import einfuse as ef
        from ..runtime.jit_ffi import FORCE_CALLBACK
        jax.config.update("jax_enable_x64", True)
        params = [jnp.asarray(arrays[k]) for k in ("w0", "w1", "w2")]
        noise = jnp.asarray(arrays["noise"])
        run = seed_function if plain else ef.jit(seed_function)
        fn = jax.jit(run if kind == "forward" else jax.grad(lambda p, n: run(p, n).sum()))
        previous = os.environ.get(FORCE_CALLBACK)
        os.environ[FORCE_CALLBACK] = "1" if callback else "0"
        try:
            jax.block_until_ready(fn(params, noise))
        finally:
            if previous is None:
                os.environ.pop(FORCE_CALLBACK)
            else:
                os.environ[FORCE_CALLBACK] = previous
        return lambda: jax.block_until_ready(fn(params, noise))
    return make


def call_case(steps: int = 10, hidden: int = 4, kind: str = "forward") -> Case:
    label = f"ef.jit call under jax.jit, seed MLP {steps} steps, {hidden} hidden"
    if kind == "grad":
        label += ", gradient"
    return Case(label, "jax.jit(ef.jit(seed_function))", seed_inputs(steps, hidden),
                [Peer("ef.jit via host callback", _jitted(kind, callback=True), "jax"),
                 Peer("jax.jit(lax.scan)", _jitted(kind, plain=True), "jax")],
                einfuse_call=_jitted(kind))


def jit_call_cases() -> List[Case]:
    return [call_case(), call_case(kind="grad")]
