"""Register blocks and lane tiles chosen from the machine (analysis/machine.py), not
fixed: the C loop nests (``tile_for``, ``block_for``, read by the lowering through the
schedule's loop choice, schedule/loop_choice.py) and the attention kernels
(``attention_block``) take their sizes from here.

A register block is ``rows`` x ``vectors`` accumulators: per step of the reduction each
row's operand is broadcast once and each of the ``vectors`` column vectors is loaded
once, then every (row, vector) pair does one multiply-add.  So

* it must fit the register file: rows x vectors accumulators + the vectors loaded +
  ``reserve`` (the broadcast, a temporary) <= vector registers -- a block that does not
  fit spills an accumulator to the stack on every step (issue 31: 64-byte blocks on a
  16-register AVX2 file);
* it should keep every FMA unit busy: at least latency x units independent chains
  (Machine.accumulators);
* among the blocks that fit, the best does the fewest loads per multiply-add,
  (rows + vectors) / (rows x vectors); ties go to more accumulators (more latency
  hidden).  Vectors per row are powers of two, so a block's width divides the usual
  extents and a row of output is walked in whole blocks.

On AVX2 (16 registers of 32 bytes) this gives 6 rows x 2 vectors (16 float32 lanes);
on AVX-512 (32 of 64 bytes) 6 rows x 4 vectors (64 lanes).  The choices are read once
per process (the machine is), and are part of every kernel's key, so a kernel built
for one machine's blocking is never reused for another's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..analysis.machine import Machine, machine

# Vector registers a statement kernel's block leaves for its operands beyond the
# accumulators and the loaded vectors: the broadcast row value and one temporary (dist's
# difference before it is squared).  A hand-written kernel whose step is a bare
# multiply-add (attention's Q K^T and P V) needs only the broadcast.
STATEMENT_RESERVE = 2
PRODUCT_RESERVE = 1
# Row counts above this gain little (loads per FMA fall as 1/rows) and cost remainder
# work on short extents.
MAX_ROWS = 8


@dataclass(frozen=True)
class Block:
    """A register block: ``rows`` x ``vectors`` accumulator registers of ``lanes``
    elements each."""
    rows: int
    vectors: int
    lanes: int

    @property
    def width(self) -> int:
        """Elements of a block's row: the lane tile of the column index."""
        return self.vectors * self.lanes

    def registers(self, reserve: int) -> int:
        return self.rows * self.vectors + self.vectors + reserve


def best_block(registers: int, accumulators: int, reserve: int, lanes: int,
               vectors: Optional[int] = None, max_rows: int = MAX_ROWS) -> Block:
    """The register block for a file of ``registers`` vector registers that wants at
    least ``accumulators`` independent chains (the fewest loads per multiply-add among
    the blocks that fit; ``vectors`` fixed when given)."""
    choices = []
    widths = (vectors,) if vectors else tuple(2 ** n for n in range(4))
    for width in widths:
        rows = min(max_rows, (registers - reserve - width) // width)
        if rows < 1:
            continue
        block = Block(rows, width, lanes)
        product = rows * width
        choices.append(((product < accumulators), (rows + width) / product, -product,
                         block))
    if not choices:
        return Block(1, 1, lanes)
    return min(choices, key=lambda choice: choice[:3])[3]


def lanes_outer(rows: int, width: int, lane_panel: bool = True) -> bool:
    """Loop order of a register-blocked loop nest: whether its lane tiles run outside
    its row blocks.  Whichever loop is outside keeps its tile's operand cached while
    the inner loop walks the other operand whole, so the inner operand is read again
    once per outer tile: extent / width times with the lane tiles outside, extent /
    rows with the rows outside.  A block is wider than it is tall (width >= rows),
    so the lane tiles go outside: AVX2 dist K=784 1024 x 1024 ran 15-30% faster so
    (standalone, the same kernel both ways), AVX-512 5-25%.

    That holds only where a lane tile has an operand of its own (``lane_panel``: a
    load that walks the lanes but not the rows, dist's ``x[k, j]``).  Where every load
    that walks the lanes walks the rows too (a convolution's ``img[i + a, j + b]``),
    nothing stays cached across row blocks, and lane tiles outside only walk the
    output and the inputs down their columns: the rows go outside, reading and writing
    along rows (AVX2, one thread, conv 1000 x 1000 * 7 x 7: 6-7 ms with the lane tiles
    outside, 2.2 ms with the rows).  (A sum of a few terms gets no row block at all:
    plan/lower.nest_order.)"""
    return lane_panel and width >= rows


@dataclass(frozen=True)
class Blocking:
    """Every blocking choice of one machine, computed once (``blocking()``)."""
    machine: Machine

    def lanes(self, itemsize: int) -> int:
        return max(1, self.machine.vector_bytes // itemsize)

    def statement_block(self, itemsize: int) -> Block:
        m = self.machine
        return best_block(m.vector_registers, m.accumulators, STATEMENT_RESERVE,
                          self.lanes(itemsize))

    def product_block(self, itemsize: int) -> Block:
        m = self.machine
        return best_block(m.vector_registers, m.accumulators, PRODUCT_RESERVE,
                          self.lanes(itemsize))

    def tile(self, itemsize: int) -> int:
        """Lanes of a 1-D lane tile (one output index vectorised, the reduction outside
        the lane loop): enough vectors for latency x units independent chains, at most
        half the register file (the loop body needs the rest), at least 8 lanes."""
        m = self.machine
        vectors = max(1, min(m.accumulators, m.vector_registers // 2))
        return max(8, vectors * self.lanes(itemsize))


@functools.lru_cache(maxsize=None)
def blocking_for(target: Machine) -> Blocking:
    return Blocking(target)


def blocking() -> Blocking:
    """This process's blocking (the machine's, read once)."""
    return blocking_for(machine())


def tile_for(working: np.dtype) -> int:
    """Lanes per 1-D output tile of a loop nest, for elements of ``working``."""
    return blocking().tile(np.dtype(working).itemsize)


def block_for(working: np.dtype) -> Tuple[int, int]:
    """(rows, lanes) of a loop nest's register block (two output indices tiled: dist,
    the matmul shape), for elements of ``working``."""
    block = blocking().statement_block(np.dtype(working).itemsize)
    return block.rows, max(4, block.width)


def attention_block(dtype: np.dtype) -> Block:
    """The attention kernels' block for Q K^T and P V (backends/c/attention*.py)."""
    return blocking().product_block(np.dtype(dtype).itemsize)


# -- strides that alias in the cache ------------------------------------------------------
# A lane tile walked along a strided axis (dist's x[k, j0:j0+16] for every k) reads one
# cache line per step, ``stride`` bytes apart.  An x86 L1 is virtually indexed within a
# page: its sets span 4096 bytes, so lines a multiple of 4096 apart all fall in one set
# (8-12 ways), and the 16-way L2 holds only a few hundred of them: the strip that the
# register block reuses across its row blocks is evicted before it is reused.  AVX2
# dist K=784 1024 x 1024 (rows of 4096 bytes) ran at 26 GFLOP/s, 71 with the rows padded
# by one line (the same kernel, the strides are runtime values).
SET_SPAN = 4096
CACHE_LINE = 64
# The fewest L1 sets a strip's lines must spread over (of SET_SPAN / CACHE_LINE = 64):
# with 16 sets x 8 ways a strip keeps 128 lines in L1 and the L2 holds it whole.
MIN_SETS = 16


def strip_sets(stride_bytes: int) -> int:
    """L1 sets that lines ``stride_bytes`` apart fall into."""
    stride = abs(int(stride_bytes)) % SET_SPAN
    if stride == 0:
        return 1
    return max(1, SET_SPAN // np.gcd(stride, SET_SPAN)) if stride >= CACHE_LINE \
        else SET_SPAN // CACHE_LINE


def aliases(stride_bytes: int) -> bool:
    """Whether a strip walked at this stride crowds into too few cache sets."""
    return abs(int(stride_bytes)) >= SET_SPAN // MIN_SETS and \
        strip_sets(stride_bytes) < MIN_SETS


def padded_row(length: int, itemsize: int) -> int:
    """Elements to allocate for a contiguous row of ``length`` elements so that the
    rows' stride does not alias (one cache line more where it would)."""
    if not aliases(length * itemsize):
        return length
    return length + max(1, CACHE_LINE // itemsize)
