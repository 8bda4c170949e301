"""The sum over the chains of a jit kernel spread over chains (runtime/jit_triton.py,
runtime/jit_chains.py): the per-chain terms of every output that is a sum over the
chains (a shared weight's gradient) lie in one flat buffer, output after output, each
``chains x size`` in chain order; one kernel sums each column over the chains in chain
order (0, 1, ..., chains - 1: the same bits on every run and every GPU, no atomics)
into one flat result, output after output."""

from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence, Tuple

from .backend import kernel_module
from .launch import PreparedLaunch

_lock = threading.Lock()
KERNEL = "ef_chain_sum"


def render_chain_sum(chains: int, sizes: Sequence[int]) -> Tuple[str, int]:
    """The kernel's source for outputs of ``sizes`` elements over ``chains`` chains, and
    its block of columns."""
    total = sum(sizes)
    block = 1
    while block < min(total, 1024):
        block *= 2
    lines = ["import triton", "import triton.language as tl", "", "",
             "@triton.jit", f"def {KERNEL}(src, dst):",
             "    pid = tl.program_id(0).to(tl.int64)",
             f"    cols = pid * {block} + tl.arange(0, {block})",
             f"    inside = cols < {total}",
             f"    shift = tl.zeros([{block}], dtype=tl.int64)",
             f"    stride = tl.zeros([{block}], dtype=tl.int64) + {sizes[0]}"]
    start = sizes[0]
    for size in sizes[1:]:
        # column c of the output starting at column `start` holds, for chain b, the
        # element at c + start * (chains - 1) + b * size of the terms
        lines.append(f"    shift = tl.where(cols >= {start}, {start * (chains - 1)}, shift)")
        lines.append(f"    stride = tl.where(cols >= {start}, {size}, stride)")
        start += size
    lines += ["    where = src + cols + shift",
              "    acc = tl.load(where, mask=inside, other=0.0)",
              f"    for b in range(1, {chains}):",
              "        acc += tl.load(where + b * stride, mask=inside, other=0.0)",
              "    tl.store(dst + cols, acc, mask=inside)", ""]
    return "\n".join(lines), block


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


__all__ = ["ChainSum", "KERNEL", "render_chain_sum"]
