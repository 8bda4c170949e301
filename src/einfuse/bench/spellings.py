"""Families of equivalent spellings (issue 31, v3.md section 1): each family is one
computation written the ways users write it; every spelling should run within 1.3x of
its family's best.  Used by ``benchmarks/spelling_families.py`` (before/after ratios),
``einfuse bench`` (``spelling_cases``) and tests/test_spelling_families.py (values, and
the same canonical program for the spellings that are the same computation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

SOFTMAX = (
    ("three statements",
     "M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\nZ[i] := sum[j](E[i,j])\n"
     "P[i,j] := E[i,j] / Z[i]"),
    ("one statement",
     "P[i,j] := exp(X[i,j] - max[k](X[i,k])) / sum[k](exp(X[i,k] - max[l](X[i,l])))"),
    ("exp(x - logsumexp(x))", "P[i,j] := exp(X[i,j] - logsumexp[k](X[i,k]))"),
)

LAYERNORM = (
    ("explicit sums",
     "m[i] := sum[j](X[i,j]) / {n}\nv[i] := sum[j]((X[i,j] - m[i])**2) / {n}\n"
     "Y[i,j] := (X[i,j] - m[i]) / sqrt(v[i] + 1e-05) * g[j] + b[j]"),
    ("mean/var sugar",
     "Y[i,j] := (X[i,j] - mean[k](X[i,k])) / sqrt(var[k](X[i,k]) + 1e-05) * g[j] + b[j]"),
    ("mean then centred mean",
     "m[i] := mean[j](X[i,j])\nv[i] := mean[j]((X[i,j] - m[i])**2)\n"
     "Y[i,j] := (X[i,j] - m[i]) / sqrt(v[i] + 1e-05) * g[j] + b[j]"),
)

_DOT = "sum[d](Q[b,h,i,d] * K[b,h,j,d])"
ATTENTION = (
    ("mask on the scores",
     f"S[b,h,i,j] := where(j <= i, {_DOT} * {{scale}}, -inf)\n"
     "m[b,h,i] := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
     "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])"),
    ("scale inside the dot",
     "S[b,h,i,j] := where(j <= i, sum[d](Q[b,h,i,d] * K[b,h,j,d] * {scale}), -inf)\n"
     "m[b,h,i] := max[j](S[b,h,i,j])\nP[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
     "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])"),
    ("mask on the weights",
     f"S[b,h,i,j] := {_DOT} * {{scale}}\nm[b,h,i] := max[j](S[b,h,i,j])\n"
     "P[b,h,i,j] := where(j <= i, exp(S[b,h,i,j] - m[b,h,i]), 0)\n"
     "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])"),
    ("weights times the mask",
     f"S[b,h,i,j] := {_DOT} * {{scale}}\nm[b,h,i] := max[j](S[b,h,i,j])\n"
     "P[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i]) * (j <= i)\n"
     "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e]) / sum[j](P[b,h,i,j])"),
    ("exp(S - logsumexp(S))",
     f"S[b,h,i,j] := where(j <= i, {_DOT} * {{scale}}, -inf)\n"
     "P[b,h,i,j] := exp(S[b,h,i,j] - logsumexp[k](S[b,h,i,k]))\n"
     "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e])"),
    ("weights normalised first",
     f"S[b,h,i,j] := where(j <= i, {_DOT} * {{scale}}, -inf)\n"
     "m[b,h,i] := max[j](S[b,h,i,j])\nE[b,h,i,j] := exp(S[b,h,i,j] - m[b,h,i])\n"
     "P[b,h,i,j] := E[b,h,i,j] / sum[k](E[b,h,i,k])\n"
     "O[b,h,i,e] := sum[j](P[b,h,i,j] * V[b,h,j,e])"),
)


@dataclass(frozen=True)
class Family:
    name: str
    spellings: Tuple[Tuple[str, str], ...]     # (what the spelling is, its program)
    inputs: Callable[[np.random.Generator], Dict[str, np.ndarray]]
    # the computation in NumPy (float64 arrays in): what every spelling must equal
    reference: Optional[Callable[[Dict[str, np.ndarray]], np.ndarray]] = None


def softmax_family(rows: int = 2048, cols: int = 1024) -> Family:
    return Family(f"softmax {rows}x{cols}", SOFTMAX, lambda rng: {
        "X": rng.standard_normal((rows, cols), dtype=np.float32)})


def layernorm_family(rows: int = 2048, cols: int = 1024) -> Family:
    spellings = tuple((name, text.replace("{n}", str(cols))) for name, text in LAYERNORM)
    return Family(f"layernorm {rows}x{cols}", spellings, lambda rng: {
        "X": rng.standard_normal((rows, cols), dtype=np.float32),
        "g": rng.standard_normal(cols, dtype=np.float32),
        "b": rng.standard_normal(cols, dtype=np.float32)})


def attention_family(B: int = 1, H: int = 4, N: int = 1024, D: int = 64) -> Family:
    scale = repr(float(1.0 / np.sqrt(D)))
    spellings = tuple((name, text.replace("{scale}", scale)) for name, text in ATTENTION)
    return Family(f"causal attention B={B} H={H} N={N} D={D}", spellings, lambda rng: {
        name: rng.standard_normal((B, H, N, D), dtype=np.float32) for name in "QKV"})


def families(quick: bool = False) -> List[Family]:
    if quick:
        return [softmax_family(64, 32), layernorm_family(64, 32),
                attention_family(1, 2, 64, 16)]
    return [softmax_family(), layernorm_family(), attention_family()]


def spelling_cases(quick: bool = False):
    """The families as ``einfuse bench`` cases: each spelling a case whose peer is the
    family's first spelling (a ratio above 1: this spelling is faster)."""
    return cases_of(families(quick))


def cases_of(chosen: List[Family]):
    """``einfuse bench`` cases of ``chosen`` families (see :func:`spelling_cases`)."""
    from .cases import Case, Peer
    cases = []
    for family in chosen:
        best_name, best_text = family.spellings[0]

        def first(arrays, text=best_text):
            import einfuse as ef
            program = ef.compile(text)
            return lambda: program(**arrays)

        for name, text in family.spellings[1:]:
            cases.append(Case(f"{family.name}: {name}", text, family.inputs, [
                Peer(f"einfuse, {best_name}", first)]))
    return cases
