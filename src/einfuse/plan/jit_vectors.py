"""The vector shape of ``ef.jit`` loop bodies, from the machine they are built for.

The jit renderer's register-blocked contractions (backends/c/loops_dot.py) and its
explicit vector math (backends/c/loops_vmath.py) are written in GCC/Clang vector
extension types.  Such a type wider than one register is split by the compiler, and
badly: a 64-byte vector of doubles on AVX2 (two ymm halves) and a block of 16 of them
(32 ymm registers' worth on a 16-register file) compiled to hundreds of stack stores
and reloads per block, with the halves moved through general registers; a vmapped
32 x 32 layer ran 11x slower than the AVX-512 build of the same source.

So the width is one register of the target (analysis/machine.py: 64 bytes with
AVX-512, 32 with AVX2, 16 with SSE or NEON) and the block is sized to the register
file: each block holds ``rows x group`` vectors of accumulators, one broadcast of the
left operand per row and one loaded vector of the right operand, all in registers.

The numbers for 32 registers are those measured on AVX-512 (a group of 8 vectors,
up to 8 rows, 16 accumulators: the 32 x 32 layer at the FMA peak); for 16 registers
the same rule, half the file in accumulators, leaves room for the broadcasts (AVX2,
a vmapped 32 x 32 layer: blocks of 2 rows x 4 vectors; 3 x 4 or 1 x 8 measured the
same within noise)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..analysis.machine import Machine, machine


@dataclass(frozen=True)
class JitVectors:
    """How the jit renderer's vector code is shaped on one machine."""
    vector_bytes: int       # one vector register: the width of every vector type used
    group: int              # vectors of accumulators along an output row, at most
    row_group: int          # the same for a single row (no rows computed together)
    rows: int               # rows of a batch of rows computed together, at most
    accumulators: int       # vectors of accumulators in a block, in all
    # whether an asm statement may pin a loaded vector to a register ("v" constraint:
    # x86 only, and only where the vector type is exactly one register)
    pin_loads: bool
    # the ``#if`` condition under which the explicit vector math is compiled: GCC with
    # vector registers of this width (other compilers keep the scalar loops)
    vector_math_condition: str
    chains: int = 8         # independent multiply-add chains that keep the FMA units busy
    # the fewest whole vectors a statement needs for the explicit vector math: below
    # that the statement is short enough that its time is one evaluation's latency,
    # where glibc's vector exp is shorter (the unbatched seed's 12-wide logistic, 3 AVX2
    # vectors: 12% less time a step through libmvec; the RNN cell's 64-float tanh, 8
    # vectors, 9% less through the vector code; on AVX-512 a row of 12 doubles, 1.5
    # vectors, ran no faster either)
    math_vectors: int = 4

    def lanes(self, itemsize: int) -> int:
        return self.vector_bytes // itemsize

    def partial_sums(self, vectors: int, extent: int) -> int:
        """Independent partial sums along the reduced index of a single row of
        ``vectors`` accumulators reduced over ``extent`` terms: more than one where the
        row alone has fewer chains than the FMA units need (``chains``), so that a
        loop step waiting on the row (an unbatched 12-wide layer: 3 AVX2 vectors, 12
        multiply-adds one after the other) waits half as long.  Each element then sums
        its terms in two (or more) interleaved partial sums added at the end: a
        rounding difference from the plain nest's order, as any vectorised sum."""
        if vectors >= self.chains:
            return 1
        split = min(self.chains // vectors, self.row_group // vectors, extent // 4)
        return max(1, split)


_WIDTH_MACRO = {64: "__AVX512F__", 32: "__AVX2__"}


def shape_for(target: Machine) -> JitVectors:
    """The vector shape for ``target``: its register width and count."""
    width = target.vector_bytes
    registers = target.vector_registers
    accumulators = registers // 2
    group = max(1, registers // 4)
    # a single row has no other rows to share its loads: all its accumulators along it
    # (a 64-float RNN row on AVX2: 8 chains, one group, not two groups of 4 one after
    # the other, 25% less time a step)
    row_group = accumulators
    rows = max(1, min(8, accumulators // 2))
    macro = _WIDTH_MACRO.get(width)
    x86 = macro is not None
    condition = (f"defined(__GNUC__) && !defined(__clang__) && defined({macro})" if x86
                 else "0")
    return JitVectors(width, group, row_group, rows, accumulators, x86, condition,
                      chains=target.accumulators)


@functools.lru_cache(maxsize=1)
def jit_vectors() -> JitVectors:
    """The vector shape for this process's C target (``EINFUSE_CPU``)."""
    return shape_for(machine())
