"""Contractions under elementwise work and reductions over inner axes (issue 32, item
3): a Linear layer with ReLU or GELU (the product on BLAS, the epilogue one pass:
plan/contraction_epilogue.py) at 64x784x256, 256x1024x1024 and 32x128x128, forward and
forward + backward, against torch's addmm + activation (einfuse given the same torch
tensors, as inside a model); and a mean over H, W
(backends/c/merge_axes.py) against torch.mean, forward and forward + backward."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, torch_peer, training_case

RELU = "y[b,o] := max(sum[i](x[b,i]*W[o,i]) + bias[o], 0)"
GELU = ("y[b,o] := 0.5*(sum[i](x[b,i]*W[o,i]) + bias[o])*"
        "(1 + erf((sum[i](x[b,i]*W[o,i]) + bias[o])*0.7071067811865476))")
MEAN = "m[b,c] := mean[h,w](X[b,c,h,w])"


def _linear_inputs(batch: int, inner: int, outer: int):
    def inputs(rng):
        return {"x": rng.standard_normal((batch, inner), dtype=np.float32),
                "W": (rng.standard_normal((outer, inner)) / inner ** 0.5).astype(np.float32),
                "bias": rng.standard_normal(outer, dtype=np.float32)}
    return inputs


def _torch_relu(x, W, bias):
    import torch
    return torch.relu(torch.addmm(bias, x, W.T))


def _torch_gelu(x, W, bias):
    import torch
    return torch.nn.functional.gelu(torch.addmm(bias, x, W.T))


def _torch_mean(X):
    return X.mean(dim=(2, 3))


def _on_tensors(statement: str):
    """einfuse's timed call on torch tensors, as the layer runs inside a torch model
    (its product then on torch's BLAS, as the peer's is), under no_grad as the peer."""
    def make(arrays, backend):
        import torch
        import einfuse as ef
        kernel = ef.compile(statement, backend=backend)
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}

        def run():
            with torch.no_grad():
                return kernel(**tensors)
        return run
    return make


def epilogue_cases(quick: bool = False) -> List[Case]:
    sizes = [(32, 128, 128)] if quick else [(64, 784, 256), (256, 1024, 1024), (32, 128, 128)]
    cases = []
    for batch, inner, outer in sizes:
        shape = f"{batch}x{inner}x{outer}"
        inputs = _linear_inputs(batch, inner, outer)
        for name, statement, twin in (("relu", RELU, _torch_relu), ("gelu", GELU, _torch_gelu)):
            cases.append(Case(f"linear+{name} {shape}", statement, inputs,
                              [torch_peer("torch addmm + activation", twin)],
                              einfuse_call=_on_tensors(statement)))
            cases.append(training_case(f"linear+{name} {shape}", statement, inputs, twin,
                                       compiled=False))
    image = (8, 16, 28, 28) if quick else (32, 64, 28, 28)

    def images(rng):
        return {"X": rng.standard_normal(image, dtype=np.float32)}
    name = "x".join(map(str, image))
    cases.append(Case(f"mean over h,w {name}", MEAN, images,
                      [torch_peer("torch.mean", _torch_mean)]))
    cases.append(training_case(f"mean over h,w {name}", MEAN, images, _torch_mean,
                               compiled=False))
    return cases
