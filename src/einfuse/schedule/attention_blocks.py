"""Launch blocks of the fused Triton attention kernel (backends/triton/attention.py):
how many query rows and keys one program's blocks hold, its warps and pipeline stages,
decided here as a value; the backend launches what it is given.

The rule (:func:`attention_blocks`), per (operand dtype, head dimension, interpreted):

* a configuration a sweep forces (``forced``: backends/triton/attention.forced_config,
  tools/gpu_attention.py) is taken;
* under the interpreter, small blocks (:data:`INTERPRETED_CONFIG`), so that short test
  sequences still cross several key blocks and a tail;
* otherwise the first of the measured candidates for the operand width and head
  dimension (:func:`candidates`).

The backward's two kernels (backends/triton/attention_backward.py) have their own rule,
:func:`attention_backward_blocks`: the interpreter's small blocks, else one untuned
configuration per operand width (:data:`BACKWARD_CONFIGS`)."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class AttentionConfig:
    """One launch configuration: rows and keys per block, warps, pipeline stages."""
    block_m: int
    block_n: int
    warps: int
    stages: int

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n} w{self.warps} s{self.stages}"


# Candidates per (operand width, head dimension), first the default: the fastest of a
# sweep on an H100 (tools/gpu_attention.py, B=4 H=8 N=4096, float16; float32 at
# N=1024), e.g. for D=64 float16 64 x 64 took 0.344 ms (full) and 0.206 ms (causal)
# against 0.349/0.224 ms for FlashAttention-2's 128 x 64.  float32 dots run without
# tensor cores (IEEE-exact): small tiles keep registers from spilling (32 x 64 with
# D=128 spilled: 10x slower).
_C = AttentionConfig
CANDIDATES = {
    ("16-bit", 64): (_C(64, 64, 4, 3), _C(128, 64, 4, 3), _C(128, 128, 8, 3),
                     _C(128, 64, 4, 4), _C(64, 64, 4, 4), _C(64, 128, 4, 3)),
    ("16-bit", 128): (_C(64, 64, 4, 3), _C(128, 64, 8, 3), _C(64, 32, 4, 3),
                      _C(64, 64, 4, 4), _C(128, 128, 8, 2), _C(64, 64, 8, 3)),
    ("float32", 64): (_C(32, 32, 4, 2), _C(64, 64, 4, 2), _C(64, 32, 8, 2),
                      _C(32, 64, 4, 2), _C(32, 32, 4, 3)),
    ("float32", 128): (_C(32, 32, 4, 2), _C(16, 32, 2, 2), _C(64, 32, 8, 2),
                       _C(32, 32, 8, 2), _C(16, 64, 4, 2)),
}
INTERPRETED_CONFIG = AttentionConfig(32, 16, 4, 1)
# The backward's blocks per operand width, not yet measured on a GPU: small tiles (the
# float32 products run IEEE-exact, without tensor cores, as in the forward).
BACKWARD_CONFIGS = {"float32": _C(32, 32, 4, 2), "16-bit": _C(64, 64, 4, 2)}


class AttentionBlockSource(enum.Enum):
    FORCED = "the configuration a sweep forces (forced_config)"
    INTERPRETER = "small blocks under the interpreter (short sequences cross several)"
    MEASURED = "the fastest of the H100 sweep for this operand width and head dimension"
    UNTUNED = "the backward's small tiles for this operand width (not yet measured on a GPU)"


@dataclass(frozen=True)
class AttentionBlockChoice:
    """The rule's answer: the configuration to launch and why."""
    source: AttentionBlockSource
    config: AttentionConfig

    @property
    def reason(self) -> str:
        return self.source.value


def head_bucket(head_dim: int) -> int:
    """The candidates' head-dimension bucket: 64 where the padded block (a power of two,
    16 at least) holds at most 64 features, 128 otherwise."""
    return 64 if head_dim <= 64 else 128


def candidates(dtype_name: str, head_dim: int) -> Tuple[AttentionConfig, ...]:
    """The configurations tried for this dtype ('float16', 'bfloat16', 'float32') and
    head dimension (the larger of D and E), the default first."""
    width = "float32" if dtype_name == "float32" else "16-bit"
    return CANDIDATES[(width, head_bucket(head_dim))]


def attention_blocks(dtype_name: str, head_dim: int, interpreted: bool,
                     forced: Optional[AttentionConfig] = None) -> AttentionBlockChoice:
    """The launch blocks of one attention call signature (the module's rule)."""
    if forced is not None:
        return AttentionBlockChoice(AttentionBlockSource.FORCED, forced)
    return _unforced(dtype_name, head_bucket(head_dim), interpreted)


@functools.lru_cache(maxsize=None)
def _unforced(dtype_name: str, bucket: int, interpreted: bool) -> AttentionBlockChoice:
    if interpreted:
        return AttentionBlockChoice(AttentionBlockSource.INTERPRETER, INTERPRETED_CONFIG)
    return AttentionBlockChoice(AttentionBlockSource.MEASURED,
                                candidates(dtype_name, bucket)[0])


def attention_backward_blocks(dtype_name: str, head_dim: int,
                              interpreted: bool) -> AttentionBlockChoice:
    """The launch blocks of the fused attention backward's two kernels for one call
    signature: under the interpreter the forward's small blocks (short test sequences
    still cross several key blocks), else the untuned configuration for the operand
    width.  (``head_dim``, the larger of D and E, is not read yet: one configuration
    per width until a sweep measures the backward.)"""
    return _backward(dtype_name, interpreted)


@functools.lru_cache(maxsize=None)
def _backward(dtype_name: str, interpreted: bool) -> AttentionBlockChoice:
    if interpreted:
        return AttentionBlockChoice(AttentionBlockSource.INTERPRETER, INTERPRETED_CONFIG)
    width = "float32" if dtype_name == "float32" else "16-bit"
    return AttentionBlockChoice(AttentionBlockSource.UNTUNED, BACKWARD_CONFIGS[width])
