"""Benchmark cases of the front ends and programs: einsum strings (a 4-operand chain
against numpy.einsum's optimised path, attention scores against torch.einsum) and
programs: softmax (as a program and as one statement) against torch.softmax, layernorm
against torch's layer_norm."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, Peer, numpy_peer, torch_peer, training_case


def _operands(*shapes):
    return lambda rng: {f"op{n}": rng.standard_normal(s, dtype=np.float32)
                        for n, s in enumerate(shapes)}


def _einsum_call(subscripts: str):
    def make(arrays, backend):
        import einfuse as ef
        operands = list(arrays.values())
        return lambda: ef.einsum(subscripts, *operands, backend=backend)
    return make


def einsum_case(label: str, subscripts: str, *shapes) -> Case:
    def numpy_fn(**arrays):
        return np.einsum(subscripts, *arrays.values(), optimize=True)

    def torch_fn(**arrays):
        import torch
        return torch.einsum(subscripts, *arrays.values())
    return Case(f"einsum {label}", f"einsum {subscripts!r}", _operands(*shapes),
                [numpy_peer("numpy.einsum(optimize=True)", numpy_fn),
                 torch_peer("torch.einsum", torch_fn)],
                einfuse_call=_einsum_call(subscripts))


SOFTMAX = """m[i] := max[j](X[i,j])
e[i,j] := exp(X[i,j] - m[i])
P[i,j] := e[i,j] / sum[k](e[i,k])"""


SOFTMAX_STATEMENT = ("P[i,j] := exp(X[i,j] - max[k](X[i,k])) / "
                     "sum[k](exp(X[i,k] - max[l](X[i,l])))")
LAYERNORM = """mu[i] := sum[j](X[i,j]) / N
v[i] := sum[j]((X[i,j] - mu[i])**2) / N
y[i,j] := (X[i,j] - mu[i]) / sqrt(v[i] + 0.00001) * g[j] + b[j]"""


def _program_call(source: str):
    def make(arrays, backend):
        import einfuse as ef
        program = ef.compile(source, backend=backend)
        return lambda: program(**arrays)
    return make


def row_inputs(rows: int, cols: int, affine: bool = False):
    """Float32 rows X (and with ``affine`` layernorm's g and b): a case's inputs."""
    def inputs(rng):
        arrays = {"X": rng.standard_normal((rows, cols), dtype=np.float32)}
        if affine:
            arrays.update(g=rng.standard_normal(cols, dtype=np.float32),
                          b=rng.standard_normal(cols, dtype=np.float32))
        return arrays
    return inputs


def torch_softmax(X):
    import torch
    return torch.softmax(X, 1)


def torch_layer_norm(X, g, b):
    import torch
    return torch.nn.functional.layer_norm(X, X.shape[1:], g, b, eps=1e-5)


def softmax_case(rows: int = 4096, cols: int = 1024, statement: bool = False) -> Case:
    source = SOFTMAX_STATEMENT if statement else SOFTMAX

    def numpy_fn(X):
        e = np.exp(X - X.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    form = "statement" if statement else "program"
    return Case(f"softmax {form} {rows}x{cols}", source.replace("\n", "; "),
                row_inputs(rows, cols),
                [numpy_peer("numpy", numpy_fn), torch_peer("torch.softmax", torch_softmax)],
                einfuse_call=_program_call(source))


def layernorm_case(rows: int = 4096, cols: int = 1024) -> Case:
    def numpy_fn(X, g, b):
        mu = X.mean(1, keepdims=True)
        return (X - mu) / np.sqrt(((X - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b
    source = LAYERNORM.replace("N", str(cols))
    return Case(f"layernorm program {rows}x{cols}", source.replace("\n", "; "),
                row_inputs(rows, cols, affine=True),
                [numpy_peer("numpy", numpy_fn),
                 torch_peer("torch layer_norm", torch_layer_norm)],
                einfuse_call=_program_call(source))


def training_frontend_cases(rows: int = 4096, cols: int = 1024) -> List[Case]:
    """Forward + backward (torch autograd, gradients of every float input) of softmax
    as a program and as one statement, and of layernorm, against torch eager."""
    x_only, with_affine = row_inputs(rows, cols), row_inputs(rows, cols, affine=True)
    size = f"{rows}x{cols}"
    return [training_case(f"softmax program {size}", SOFTMAX, x_only, torch_softmax,
                          compiled=False),
            training_case(f"softmax statement {size}", SOFTMAX_STATEMENT, x_only,
                          torch_softmax, compiled=False),
            training_case(f"layernorm program {size}", LAYERNORM.replace("N", str(cols)),
                          with_affine, torch_layer_norm, compiled=False)]


def jax_training_cases(rows: int = 4096, cols: int = 1024) -> List[Case]:
    """``jax.jit(jax.grad(...))`` of a loss through the softmax and layernorm programs
    (runtime/jax_program.py: the program's backward), against the same loss through the
    jax.numpy formulas."""
    def inputs(rng):
        return {"X": rng.standard_normal((rows, cols), dtype=np.float32),
                "g": rng.standard_normal(cols, dtype=np.float32),
                "b": rng.standard_normal(cols, dtype=np.float32),
                "seed": rng.standard_normal((rows, cols), dtype=np.float32)}

    def softmax(jnp, X, g, b):
        import jax
        return jax.nn.softmax(X, axis=1)

    def layernorm(jnp, X, g, b):
        mu = X.mean(1, keepdims=True)
        return (X - mu) / jnp.sqrt(((X - mu) ** 2).mean(1, keepdims=True) + 1e-5) * g + b

    def gradient(forward):
        import jax
        import jax.numpy as jnp
        return jax.jit(jax.grad(lambda X, g, b, seed: (forward(jnp, X, g, b) * seed).sum(),
                                (0, 1, 2)))

    def timed(forward):
        def make(arrays):
            import jax
            import jax.numpy as jnp
            values = {k: jnp.asarray(v) for k, v in arrays.items()}
            step = gradient(forward)
            ordered = [values[k] for k in ("X", "g", "b", "seed")]
            return lambda: jax.block_until_ready(step(*ordered))
        return make

    def ours(source, affine: bool):
        def make(arrays, backend):
            import einfuse as ef
            program = ef.compile(source, backend=backend)
            return timed(lambda jnp, X, g, b: program(X=X, g=g, b=b) if affine
                         else program(X=X))(arrays)
        return make
    size = f"{rows}x{cols}"
    layernorm_source = LAYERNORM.replace("N", str(cols))
    return [Case(f"jax.grad softmax program {size}", SOFTMAX, inputs,
                 [Peer("jax.jit(jax.grad)", timed(softmax), "jax")],
                 einfuse_call=ours(SOFTMAX, False)),
            Case(f"jax.grad layernorm program {size}", layernorm_source, inputs,
                 [Peer("jax.jit(jax.grad)", timed(layernorm), "jax")],
                 einfuse_call=ours(layernorm_source, True))]


def frontend_cases(quick: bool = False) -> List[Case]:
    from .cases import installed
    # the shapes, and a small one where per-call costs weigh (hidden shapes)
    training = training_frontend_cases(256, 128) if quick else \
        training_frontend_cases() + training_frontend_cases(256, 256)
    jax_training = jax_training_cases(256, 128) if quick else \
        jax_training_cases() + jax_training_cases(256, 256)
    return _frontend_cases(quick) + (training if installed("torch") else []) + \
        (jax_training if installed("jax") else [])


def _frontend_cases(quick: bool) -> List[Case]:
    if quick:
        return [einsum_case("chain 4 operands", "ab,bc,cd,de->ae", (32, 64), (64, 32),
                            (32, 64), (64, 16)),
                einsum_case("bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", (2, 2, 32, 16),
                            (2, 2, 32, 16)),
                softmax_case(256, 128), softmax_case(256, 128, statement=True),
                layernorm_case(256, 128)]
    return [einsum_case("chain 4 operands", "ab,bc,cd,de->ae", (256, 1024), (1024, 256),
                        (256, 1024), (1024, 128)),
            einsum_case("bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", (4, 8, 512, 64),
                        (4, 8, 512, 64)),
            softmax_case(), softmax_case(statement=True), layernorm_case()]
