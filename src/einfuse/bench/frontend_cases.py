"""Benchmark cases of the front ends and programs: einsum strings (a 4-operand chain
against numpy.einsum's optimised path, attention scores against torch.einsum) and a
softmax program against torch.softmax."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, numpy_peer, torch_peer


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


def softmax_case(rows: int = 4096, cols: int = 1024) -> Case:
    def make(arrays, backend):
        import einfuse as ef
        program = ef.compile(SOFTMAX, backend=backend)
        return lambda: program(**arrays)

    def torch_fn(X):
        import torch
        return torch.softmax(X, 1)

    def numpy_fn(X):
        e = np.exp(X - X.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    return Case(f"softmax program {rows}x{cols}", SOFTMAX.replace("\n", "; "),
                lambda rng: {"X": rng.standard_normal((rows, cols), dtype=np.float32)},
                [numpy_peer("numpy", numpy_fn), torch_peer("torch.softmax", torch_fn)],
                einfuse_call=make)


def frontend_cases(quick: bool = False) -> List[Case]:
    if quick:
        return [einsum_case("chain 4 operands", "ab,bc,cd,de->ae", (32, 64), (64, 32),
                            (32, 64), (64, 16)),
                einsum_case("bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", (2, 2, 32, 16),
                            (2, 2, 32, 16)),
                softmax_case(256, 128)]
    return [einsum_case("chain 4 operands", "ab,bc,cd,de->ae", (256, 1024), (1024, 256),
                        (256, 1024), (1024, 128)),
            einsum_case("bhqd,bhkd->bhqk", "bhqd,bhkd->bhqk", (4, 8, 512, 64),
                        (4, 8, 512, 64)),
            softmax_case()]
