"""Why the C fusion groups end where they do (schedule/fusion.py): each rule a statement
must meet to join the group before it, as a value, so that the schedule records which
one stopped a group and ``explain`` can say it.

A group ends at the first statement that breaks a rule (or when the program ends); a
statement that breaks one on its own (a BLAS contraction, an update ``+=``) runs alone.
The text of each member is worded to follow "statement N ..." in explain's output."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Split(enum.Enum):
    """The rule a statement broke, so that it did not join the kernel before it."""
    UPDATES = "writes into an existing array ('=' or '+='), which a fused loop over " \
              "rows does not"
    NO_OUTPUT_INDEX = "has no output index to run rows over"
    GATHERS_INTERMEDIATE = "uses an intermediate of the kernel as an index array (its " \
                           "values decide which elements are read)"
    NOT_BOUND = "cannot be bound to the kernel's intermediates"
    FRAMEWORK = "runs on arrays that are not NumPy arrays on the host (autograd and JAX " \
                "trace statements one by one)"
    ROUNDED = "gives its result in another dtype than the one it computes in"
    DTYPE_KIND = "computes in a dtype the fused kernels do not take"
    OTHER_DTYPE = "computes in another dtype than the kernel's statements"
    OTHER_PADDING = "has another pad= or fill= than the kernel's statements"
    MEMORY = "has a result larger than the memory can hold (alone it says so)"
    OTHER_BACKEND = "runs on another backend than C"
    POSITION_REDUCTION = "takes an argmax/argmin, which the fused loop does not carry"
    BLAS = "is a contraction that BLAS computes"
    EMPTY = "has an empty result"
    NOT_ONE_LOOP = "is not one loop nest without packed inputs (its inputs are packed " \
                   "for vector lanes, or it lowers to several loop nests)"
    NO_PARALLEL_LOOP = "has no outer parallel loop to share (its outermost loop reduces)"
    OTHER_ROWS = "runs over other rows than the kernel's (another extent, or a start " \
                 "other than 0)"
    OTHER_ROW_READ = "reads an intermediate of the kernel at another row than the one " \
                     "just written (a reduction or a shift crosses the loop over rows)"
    READS_COLUMN_SUM = "reads a sum over the kernel's rows, which is complete only " \
                       "when the kernel's loop over rows ends"
    SUMMED_PRODUCT = "sums a product over the rows (a contraction BLAS computes)"
    COLUMN_UNFIT = "sums over rows, but not over the kernel's loop over rows, not in " \
                   "floating point, or with rows too long for its accumulators to stay " \
                   "in cache"
    GROUP_FULL = "would make the kernel longer than the most statements one kernel " \
                 "holds (the C compiler's time grows faster than the kernel)"
    LITTLE_WORK = "and the kernel before it have too little work for a fused kernel to " \
                  "pay for binding it"
    NO_COMPILER = "cannot be fused: no C compiler is available"
    # the Triton row groups' own rules (schedule/row_groups.py)
    ROW_SHAPE = "has not one or two output indices (a row, or rows and columns), or " \
                "has pad="
    NOT_TRITON = "does not run on the Triton backend on torch tensors (or a host " \
                 "fallback takes it)"
    HOISTED_FORM = "runs its own hoisted form (its loop-invariant reductions first)"
    NOT_TENSOR = "reads a number or a list where the group's launch takes tensors"
    PARAMETER = "has a scalar parameter that is not a real number"
    ROW_UNFIT = "does not fit a row of registers (its subscripts, reductions or row " \
                "length are not what one program of the group holds)"
    GATHER_POLICY = "gathers under bounds= 'clip', 'wrap' or 'fill' (a row group's " \
                    "labels are checked, under 'check' or 'promise', and raise)"


@dataclass(frozen=True)
class KernelBreak:
    """``statement`` (0-based) did not join the kernel before it, for ``reason``;
    ``alone``: it broke the rule on its own (no kernel could take it)."""
    statement: int
    reason: Split
    alone: bool = False

    def describe(self) -> str:
        if self.reason is Split.LITTLE_WORK:
            return f"statement {self.statement + 1} {self.reason.value}"
        if self.alone:
            return f"statement {self.statement + 1} runs alone: it {self.reason.value}"
        return f"statement {self.statement + 1} starts a new kernel: it {self.reason.value}"


__all__ = ["KernelBreak", "Split"]
