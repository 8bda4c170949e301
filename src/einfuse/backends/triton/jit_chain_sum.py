"""The sum over the chains of a jit kernel spread over chains (runtime/jit_triton.py,
runtime/jit_chains.py): the per-chain terms of every output that is a sum over the
chains (a shared weight's gradient) lie in one flat buffer, output after output, each
``chains x size`` in chain order; each column is summed over the chains in chain order
(0, 1, ..., chains - 1: the same bits on every run and every GPU, no atomic adds of
values) into one flat result, output after output -- by the jit kernel's last program
to finish, in the same launch (:func:`with_chain_sums`, where the columns fit one
block), else by a kernel of its own (:class:`ChainSum`)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from .backend import kernel_module
from .jit_render import RenderedJit
from .launch import PreparedLaunch

_lock = threading.Lock()
KERNEL = "ef_chain_sum"


# the most columns (elements of the summed outputs of one dtype, together) whose sum the
# jit kernel's last program adds itself: one block, what ChainSum would launch one
# program for anyway
IN_KERNEL_COLUMNS = 1024


def block_of(total: int) -> int:
    """The block of columns for ``total`` columns: the power of two covering them, at
    most 1024."""
    block = 1
    while block < min(total, 1024):
        block *= 2
    return block


def sum_lines(chains: int, sizes: Sequence[int], block: int, cols: str, terms: str,
              dst: str, indent: str, cached: bool = False, prefix: str = "") -> List[str]:
    """The lines that sum the block of columns ``cols`` (an int64 vector expression of
    ``block`` columns) of the terms at ``terms`` over the chains, in chain order, into
    ``dst``; ``cached``: the loads read from L2 (``.cg``: terms other programs wrote);
    ``prefix``: of the lines' own names (none of the kernel they join may be reused)."""
    total = sum(sizes)
    modifier = ', cache_modifier=".cg"' if cached else ""
    c, inside, shift, stride, where, acc, b = (
        prefix + n for n in ("cols", "inside", "shift", "stride", "where", "acc", "b"))
    lines = [f"{c} = {cols}",
             f"{inside} = {c} < {total}",
             f"{shift} = tl.zeros([{block}], dtype=tl.int64)",
             f"{stride} = tl.zeros([{block}], dtype=tl.int64) + {sizes[0]}"]
    start = sizes[0]
    for size in sizes[1:]:
        # column c of the output starting at column `start` holds, for chain b, the
        # element at c + start * (chains - 1) + b * size of the terms
        lines.append(f"{shift} = tl.where({c} >= {start}, {start * (chains - 1)}, {shift})")
        lines.append(f"{stride} = tl.where({c} >= {start}, {size}, {stride})")
        start += size
    lines += [f"{where} = {terms} + {c} + {shift}",
              f"{acc} = tl.load({where}, mask={inside}, other=0.0{modifier})",
              f"for {b} in range(1, {chains}):",
              f"    {acc} += tl.load({where} + {b} * {stride}, mask={inside}, "
              f"other=0.0{modifier})",
              f"tl.store({dst} + {c}, {acc}, mask={inside})"]
    return [indent + line for line in lines]


def render_chain_sum(chains: int, sizes: Sequence[int]) -> Tuple[str, int]:
    """The kernel's source for outputs of ``sizes`` elements over ``chains`` chains, and
    its block of columns."""
    block = block_of(sum(sizes))
    lines = ["import triton", "import triton.language as tl", "", "",
             "@triton.jit", f"def {KERNEL}(src, dst):",
             "    pid = tl.program_id(0).to(tl.int64)"]
    lines += sum_lines(chains, sizes, block, f"pid * {block} + tl.arange(0, {block})",
                       "src", "dst", "    ")
    return "\n".join(lines + [""]), block


def with_chain_sums(rendered: RenderedJit, chains: int,
                    groups: Sequence[Sequence[int]]) -> RenderedJit:
    """``rendered`` (the one-chain kernel over the chains, its outputs' per-chain terms
    stored by each program) with the sums over the chains in the same launch: three
    more parameters per call -- per group (of ``groups``: its outputs' sizes, each group
    at most IN_KERNEL_COLUMNS columns) the flat terms buffer and the sums' buffer, then a
    ticket (one int32, zero) -- and, after the stores, each program takes a ticket (its
    stores made first: the barrier; a scalar atomic is one thread's), and the program
    that takes the last sums every column over the chains in chain order, as the
    separate kernel does (the same additions in the same order: the same bits, on every
    run, whichever program ends last)."""
    header = f"def {rendered.kernel}("
    lines = rendered.source.split("\n")
    at = next(k for k, line in enumerate(lines) if line.startswith(header))
    if not lines[at].endswith("):"):
        raise ValueError("the jit kernel's signature is not on one line")
    extra = [f"ef_terms{g}, ef_sums{g}" for g in range(len(groups))] + ["ef_ticket"]
    lines[at] = lines[at][:-2] + ", " + ", ".join(extra) + "):"
    while lines and not lines[-1].strip():
        lines.pop()
    lines += ["    tl.debug_barrier()",
              "    ef_taken = tl.atomic_add(ef_ticket, 1)",
              "    if ef_taken == tl.num_programs(0) - 1:"]
    for g, sizes in enumerate(groups):
        if sum(sizes) > IN_KERNEL_COLUMNS:
            raise ValueError("a group of more columns than one block")
        block = block_of(sum(sizes))
        lines += sum_lines(chains, sizes, block, f"tl.arange(0, {block}).to(tl.int64)",
                           f"ef_terms{g}", f"ef_sums{g}", "        ", cached=True,
                           prefix=f"ef_{g}_")
    return dataclasses.replace(rendered, source="\n".join(lines) + "\n")


class ChainSum:
    """The kernel for one (chains, sizes), launched on (terms, result) torch tensors."""

    def __init__(self, chains: int, sizes: Sequence[int]):
        self.chains, self.sizes = int(chains), tuple(int(s) for s in sizes)
        source, self.block = render_chain_sum(self.chains, self.sizes)
        _, module = kernel_module(source)
        self.kernel = getattr(module, KERNEL)
        self.programs = -(-sum(self.sizes) // self.block)
        self._launches: Dict[Optional[int], PreparedLaunch] = {}

    def __call__(self, terms, result) -> None:
        device = result.device
        index = device.index if device.type == "cuda" else None
        with _lock:
            launch = self._launches.get(index)
            if launch is None:
                launch = PreparedLaunch(self.kernel, (self.programs,),
                                        {"num_warps": 4 if self.block >= 512 else 1}, {},
                                        index)
                self._launches[index] = launch
        launch(terms, result)


__all__ = ["ChainSum", "IN_KERNEL_COLUMNS", "KERNEL", "render_chain_sum", "with_chain_sums"]
