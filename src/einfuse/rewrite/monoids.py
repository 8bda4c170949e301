"""Reductions as monoids: an identity, a combine of two partial states and a finalise
from a state to the value (only the one the online-softmax rewrite needs is defined
here; the statements' own reductions keep their renderer-specific forms).  The
online-softmax rewrite (rewrite/online_softmax.py) reduces with the *softmax-weighted
sum* below, whose state is (running max ``m``, running denominator ``l``, running
numerator ``acc``); combining two partial states rescales the one with the smaller max,
which is what lets attention run in one pass over ``j`` (FlashAttention).  The NumPy executor of that rewrite (runtime/attention.py)
combines through these functions; the C kernel (backends/c/attention.py) implements the
same combine per block of ``j`` in registers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple

import numpy as np


@dataclass(frozen=True)
class Monoid:
    name: str
    identity: Callable[[Tuple[int, ...], np.dtype], object]   # shape, dtype -> state
    combine: Callable[[object, object], object]
    finalise: Callable[[object], np.ndarray]


@dataclass(frozen=True)
class WeightedState:
    """A partial softmax-weighted sum over some of the ``j``: ``m`` the largest score
    seen (-inf: none finite yet), ``l`` = sum exp(s - m), ``acc`` = sum exp(s - m) * v
    (the weight of a score of -inf is 0 until the end, see ``finalise``)."""
    m: np.ndarray
    l: np.ndarray
    acc: np.ndarray


def _rescale(m: np.ndarray, new: np.ndarray) -> np.ndarray:
    # equal maxima (both -inf included: nothing was added yet) need no rescaling;
    # exp(-inf - -inf) would be NaN
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(m == new, 1.0, np.exp(m - new)).astype(m.dtype)


def _combine_weighted(a: WeightedState, b: WeightedState) -> WeightedState:
    m = np.maximum(a.m, b.m)          # propagates NaN, as max[j] does
    ca, cb = _rescale(a.m, m), _rescale(b.m, m)
    return WeightedState(m, a.l * ca + b.l * cb,
                         a.acc * ca[..., None] + b.acc * cb[..., None])


def finalise_weighted(state: WeightedState, normalise: bool) -> np.ndarray:
    """sum_j exp(s_j - M) v_j (/ sum_j exp(s_j - M)) with M = max_j s_j.  With M = -inf
    (no finite score, or every j masked) each weight exp(-inf - -inf) is NaN, as the
    statements run one by one give."""
    with np.errstate(invalid="ignore", divide="ignore"):
        value = state.acc / state.l[..., None] if normalise else state.acc
    return np.where((state.m == -np.inf)[..., None], np.nan, value).astype(state.acc.dtype)


SOFTMAX_WEIGHTED_SUM = Monoid(
    "softmax-weighted sum",
    lambda shape, dtype: WeightedState(np.full(shape[:-1], -np.inf, dtype),
                                       np.zeros(shape[:-1], dtype), np.zeros(shape, dtype)),
    _combine_weighted,
    lambda state: finalise_weighted(state, True))
