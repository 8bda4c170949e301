"""Benchmark cases of ``ef.jit`` (issue 12): the seed workload of JAX issue #7024 - a tiny
MLP iterated in a ``lax.scan`` - as one einfuse kernel against ``jax.jit`` of the same
function; the same vmapped over chains; and its gradient.  Also a tanh RNN cell over a
sequence (issue 32: hidden 64, float32) under jax.jit, forward and gradient.  float64
needs JAX's x64 mode, which these cases switch on (for the benchmark process)."""

from __future__ import annotations

from .cases import Case, Peer


def seed_function(params, noise):
    import jax
    import jax.numpy as jnp

    def body(x, n):
        for w in params:
            x = jax.nn.sigmoid(x @ jax.nn.softplus(w))
        return x + n, None
    return jax.lax.scan(body, jnp.zeros(noise.shape[-1], noise.dtype), noise)[0]


def seed_inputs(steps: int, hidden: int, chains: int = 0, dtype: str = "float64"):
    def make(rng):
        arrays = {"w0": rng.standard_normal((1, hidden)), "w1": rng.standard_normal((hidden, hidden)),
                  "w2": rng.standard_normal((hidden, 1))}
        shape = (chains, steps, 1) if chains else (steps, 1)
        arrays["noise"] = rng.standard_normal(shape) * 0.1
        return {name: array.astype(dtype) for name, array in arrays.items()}
    return make


def _function(kind: str, chains: int):
    import jax
    jax.config.update("jax_enable_x64", True)
    run = seed_function
    if chains:
        run = jax.vmap(seed_function, in_axes=(None, 0))
    if kind == "grad":
        base = run
        run = jax.grad(lambda p, n: base(p, n).sum())
    return run


def _einfuse_call(kind: str, chains: int):
    def make(arrays, backend):
        import jax
        import jax.numpy as jnp
        import einfuse as ef
        jax.config.update("jax_enable_x64", True)
        params = [jnp.asarray(arrays[k]) for k in ("w0", "w1", "w2")]
        noise = jnp.asarray(arrays["noise"])
        if kind == "grad":
            inner = ef.jit(seed_function)
            if chains:
                inner = jax.vmap(inner, in_axes=(None, 0))
            fn = jax.jit(jax.grad(lambda p, n: inner(p, n).sum()))
        elif chains:
            fn = jax.jit(jax.vmap(ef.jit(seed_function), in_axes=(None, 0)))
        else:
            fn = ef.jit(seed_function)      # eager: the kernel runs directly
        return lambda: jax.block_until_ready(fn(params, noise))
    return make


def _jax_peer(kind: str, chains: int) -> Peer:
    def make(arrays):
        import jax
        import jax.numpy as jnp
        fn = jax.jit(_function(kind, chains))
        params = [jnp.asarray(arrays[k]) for k in ("w0", "w1", "w2")]
        noise = jnp.asarray(arrays["noise"])
        return lambda: jax.block_until_ready(fn(params, noise))
    return Peer("jax.jit(lax.scan)", make, "jax")


def seed_case(steps: int = 8000, hidden: int = 12, chains: int = 0, kind: str = "forward",
              dtype: str = "float64") -> Case:
    label = f"ef.jit seed MLP scan {steps} steps, {hidden} hidden"
    if chains:
        label += f", vmap {chains} chains"
    if kind == "grad":
        label += ", gradient"
    if dtype != "float64":
        label += f", {dtype}"
    return Case(label, "ef.jit(seed_function)", seed_inputs(steps, hidden, chains, dtype),
                [_jax_peer(kind, chains)], einfuse_call=_einfuse_call(kind, chains))


def rnn_cell_function(params, xs):
    """``h = tanh(h @ w_h + x @ w_in + b)`` over the rows of ``xs``; the last ``h``."""
    import jax
    import jax.numpy as jnp
    w_in, w_h, b = params

    def cell(h, x):
        return jnp.tanh(h @ w_h + x @ w_in + b), None
    return jax.lax.scan(cell, jnp.zeros(w_h.shape[0], xs.dtype), xs)[0]


def rnn_inputs(steps: int, hidden: int, features: int, dtype: str = "float32"):
    def make(rng):
        scale = hidden ** -0.5
        arrays = {"w_in": rng.standard_normal((features, hidden)) * scale,
                  "w_h": rng.standard_normal((hidden, hidden)) * scale,
                  "b": rng.standard_normal(hidden) * 0.1,
                  "xs": rng.standard_normal((steps, features))}
        return {name: array.astype(dtype) for name, array in arrays.items()}
    return make


def _rnn_function(kind: str, fast: bool):
    """The cell's scan (through ``ef.jit`` when ``fast``), or the gradient of its sum."""
    import jax

    import einfuse as ef
    run = ef.jit(rnn_cell_function) if fast else rnn_cell_function
    if kind != "grad":
        return run
    return jax.grad(lambda p, xs: run(p, xs).sum())


def _rnn_call(kind: str, fast: bool):
    def make(arrays, backend=None):
        import jax
        import jax.numpy as jnp
        params = [jnp.asarray(arrays[k]) for k in ("w_in", "w_h", "b")]
        xs = jnp.asarray(arrays["xs"])
        # under jax.jit, as in a model (the eager call adds ~45 us of Python a call)
        fn = jax.jit(_rnn_function(kind, fast))
        return lambda: jax.block_until_ready(fn(params, xs))
    return make


def rnn_case(steps: int = 2000, hidden: int = 64, features: int = 16, kind: str = "forward",
             dtype: str = "float32") -> Case:
    label = f"ef.jit tanh RNN cell scan {steps} steps, {hidden} hidden, {features} inputs, {dtype}"
    if kind == "grad":
        label += ", gradient"
    peer = Peer("jax.jit(lax.scan)", lambda arrays: _rnn_call(kind, False)(arrays), "jax")
    return Case(label, "ef.jit(rnn_cell_function)", rnn_inputs(steps, hidden, features, dtype),
                [peer], einfuse_call=_rnn_call(kind, True))
