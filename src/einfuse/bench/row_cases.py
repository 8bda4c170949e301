"""Row operations at the memory limit (issue 31, item 6): softmax, layernorm, RMSNorm,
logsumexp and cross-entropy (the last two in the spellings users write) over the rows
of a 4096x1024 float32 matrix, each against torch eager and torch.compile
(benchmarks/row_bandwidth.py reports each as a share of the machine's copy
bandwidth)."""

from __future__ import annotations

from typing import List

import numpy as np

from .cases import Case, torch_peer

EPS = 1e-05


def _programs(cols: int, rows: int):
    """name -> (program, the torch twin's body, the inputs it reads)."""
    return {
        "softmax": ("M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\n"
                    "Z[i] := sum[j](E[i,j])\nP[i,j] := E[i,j] / Z[i]",
                    lambda F, torch: lambda X: torch.softmax(X, 1), "X"),
        "layernorm": (f"m[i] := sum[j](X[i,j]) / {cols}\n"
                      f"v[i] := sum[j]((X[i,j] - m[i])**2) / {cols}\n"
                      f"Y[i,j] := (X[i,j] - m[i]) / sqrt(v[i] + {EPS}) * g[j] + b[j]",
                      lambda F, torch: lambda X, g, b: F.layer_norm(X, (cols,), g, b, EPS),
                      "Xgb"),
        "rmsnorm": (f"r[i] := sqrt(sum[j](X[i,j]**2) / {cols} + {EPS})\n"
                    "Y[i,j] := X[i,j] / r[i] * g[j]",
                    lambda F, torch: lambda X, g: F.rms_norm(X, (cols,), g, EPS), "Xg"),
        "logsumexp": ("z[i] := logsumexp[j](X[i,j])",
                      lambda F, torch: lambda X: torch.logsumexp(X, 1), "X"),
        "cross-entropy": ("m[i] := max[j](X[i,j])\n"
                          "l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]",
                          lambda F, torch: lambda X, t: F.cross_entropy(
                              X, t, reduction="none"), "Xt"),
        # other spellings of the last two (plan/row_statistics.py runs each by rows)
        "logsumexp as max + log-sum-exp": (
            "m[i] := max[j](X[i,j])\nl[i] := m[i] + log(sum[j](exp(X[i,j] - m[i])))",
            lambda F, torch: lambda X: torch.logsumexp(X, 1), "X"),
        "cross-entropy as one statement": (
            "l[i] := logsumexp[j](X[i,j]) - X[i, t[i]]",
            lambda F, torch: lambda X, t: F.cross_entropy(X, t, reduction="none"), "Xt"),
        "cross-entropy mean": (
            "m[i] := max[j](X[i,j])\n"
            "l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]\n"
            f"L[] := sum[i](l[i]) / {rows}",
            lambda F, torch: lambda X, t: F.cross_entropy(X, t), "Xt"),
        "log-softmax": ("Y[i,j] := X[i,j] - logsumexp[k](X[i,k])",
                        lambda F, torch: lambda X: torch.log_softmax(X, 1), "X"),
        "cross-entropy mean as one statement": (
            f"L[] := sum[i](logsumexp[j](X[i,j]) - X[i, t[i]]) / {rows}",
            lambda F, torch: lambda X, t: F.cross_entropy(X, t), "Xt"),
    }


def _twin(body):
    def fn(**arrays):
        import torch
        return body(torch.nn.functional, torch)(**arrays)
    return fn


def row_cases(quick: bool = False) -> List[Case]:
    rows, cols = (64, 128) if quick else (4096, 1024)
    cases = []
    for name, (text, body, reads) in _programs(cols, rows).items():
        def inputs(rng, reads=reads):
            arrays = {"X": rng.standard_normal((rows, cols), dtype=np.float32),
                      "g": rng.standard_normal(cols, dtype=np.float32),
                      "b": rng.standard_normal(cols, dtype=np.float32),
                      "t": rng.integers(0, cols, rows)}
            return {k: v for k, v in arrays.items() if k in reads}
        cases.append(Case(f"row {name} {rows}x{cols}", text, inputs, [
            torch_peer("torch eager", _twin(body)),
            torch_peer("torch.compile", _twin(body), compiled=True)]))
    return cases
