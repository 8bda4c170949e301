"""The steps of a program's backward (backward.py builds them, backward_fold.py folds
them): a contribution to a gradient, and a gradient's total of its parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..autodiff.derive import GradientStatement


@dataclass(frozen=True)
class Contribution:
    """One share of the gradient ``target`` (``d<name>``), computed into ``key`` by
    ``statement`` (a gather whose output is ``key``, or a scatter that adds into a
    zero array named ``key``)."""
    key: str
    target: str
    like: str                      # the forward name whose shape the gradient has
    statement: GradientStatement


@dataclass(frozen=True)
class Total:
    """``target := sum of parts`` (names of contributions or the caller's seed);
    ``like`` is the forward name whose shape the gradient has."""
    target: str
    parts: Tuple[str, ...]
    like: str
