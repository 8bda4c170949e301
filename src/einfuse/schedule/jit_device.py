"""Where an ``ef.jit`` call runs: the host C kernel (backends/c/loops.py) or the one
Triton kernel (backends/triton/jit_render.py), decided by a stated cost rule so that
``explain`` can say which was chosen and why.

The rule, per call signature (``backend="auto"``):

* arrays on the host: the host kernel (it runs on them where they are);
* arrays on a GPU: the estimated times are compared --
  host = its operations x batch at HOST_NS_PER_OP (HOST_NS_PER_BATCHED_OP for a batch:
  blocks of chains in SIMD lanes, over the OpenMP threads at THREAD_EFFICIENCY), plus
  copying the arrays to the host and back (COPY_US and COPY_GB_PER_S); device =
  LAUNCH_US plus the statements one program runs one after another (each scan body
  times its length) at
  DEVICE_NS_PER_STATEMENT, times the waves of programs the batch needs on DEVICE_SMS
  multiprocessors -- and the smaller wins: one tiny chain stays on the host, a batch
  of chains goes to the GPU.

``backend="triton"`` forces the Triton kernel wherever it can run (a GPU, or the
interpreter under ``TRITON_INTERPRET=1``); ``backend="c"`` forces the host kernel.
Either way a program the Triton renderer declines, or whose tiles do not fit one
program's registers (TILE_LIMIT, REGISTER_LIMIT), runs on the host, with the reason.

A vmapped batch is spread over programs and, where the rule of :func:`lanes_for`
says so, over **lanes**: L chains (a power of two) of the innermost batch level per
program, the chain axis an axis of every tile (leading, where JAX's batching puts it
there: all but a scan's stacked values; backends/triton/jit_lanes.py).  The rule
weighs, for each L that fits one program (L times the one-chain program's largest tile
within TILE_LIMIT, L times its register elements within REGISTER_LIMIT):
waves(L) x rounds(L), where waves(L) = ceil(programs / (DEVICE_SMS x PROGRAMS_PER_SM))
(the batches of programs the GPU runs one after another) and rounds(L) =
ceil(L x largest / (32 x warps)), warps = warps_for(L x largest) (how many elements
of its largest tile each thread of a program holds: the time of one of its
statements); the smallest wins, ties to the larger L (fewer programs, each shared weight loaded once for L chains).  So
lanes fill the threads of a program whose tiles are smaller than a warp, and take over
when the batch is more than one wave of programs; a batch of 256 chains of 16 x 16
tiles stays at one chain per program.  ``EINFUSE_JIT_LANES`` = n asks for n lanes
(rounded down to a power of two, still within the fit; for tests and tuning).

A function of a whole batch of chains (``jax.grad`` of a sum over a ``jax.vmap``: the
batch is in its primitives, no vmap left; runtime/jit_chains.py recovers the one-chain
function) runs as that function spread over programs and lanes, then one fixed-order
sum kernel per dtype of the gradients of shared weights, where :func:`spread_over_chains`
says so: always where the whole batch as one program runs no Triton kernel (its tiles
past the limits), else where serial statements x rounds x waves plus the sums' launches
cost less than the one program's statements x rounds.

The host constants are measured (the seed, 8000 steps, 12 hidden, float64, one core of
an AVX-512 EPYC: 0.40 ns per operation for one chain, 0.09 for 64 vmapped chains); the
device ones are estimates, not calibrated on a GPU yet; they decide only between two
correct kernels."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from ..analysis.cost import typed_work
from ..analysis.thread_policy import default_threads
from ..ir import Assign, JitProgram, Loop, LoopKind, Switch

BACKENDS = ("auto", "c", "triton")

HOST_NS_PER_OP = 0.4            # the C kernel, one chain, one core (measured, see above)
HOST_NS_PER_BATCHED_OP = 0.1    # ... a vmapped batch, per core (measured)
THREAD_EFFICIENCY = 0.3         # a batch over the OpenMP threads: the H100 machine's C
                                # kernel ran the 256-chain seed in 16.7 ms
                                # (benchmarks/results/gpu.md), 4.4 cores' worth at the rate above
COPY_US = 20.0                  # one device -> host -> device round trip of the arrays
COPY_GB_PER_S = 10.0
LAUNCH_US = 8.0
DEVICE_NS_PER_STATEMENT = 150.0  # a dependent tile statement in one program (a warp's
                                 # reduction, a few math ops; a guess until measured)
DEVICE_SMS = 132
PROGRAMS_PER_SM = 8
TILE_LIMIT = 16384              # elements of one tile (register pressure of one program)
REGISTER_LIMIT = 32768          # elements of all register tensors of one program
WARP = 32                       # threads of a warp
LANES_ENV = "EINFUSE_JIT_LANES"
CHAINS_ENV = "EINFUSE_JIT_CHAINS"


@dataclass(frozen=True)
class DeviceChoice:
    """``triton`` (run the Triton kernel) or not, the reason in words, and the warps per
    program when it is."""
    triton: bool
    reason: str
    num_warps: int = 1

    def describe(self) -> str:
        where = "one Triton kernel" if self.triton else "the host C kernel"
        return f"{where}: {self.reason}"


def serial_statements(steps, repeat: int = 1) -> int:
    """Statements one program runs one after another: scan bodies times their lengths,
    a while loop's condition and body once (its trip count is not known), the longest
    branch of a cond."""
    total = 0
    for step in steps:
        if isinstance(step, Loop):
            inner = repeat * (step.length if step.kind is LoopKind.SCAN else 1)
            total += serial_statements(step.condition_steps, inner)
            total += serial_statements(step.body, inner)
        elif isinstance(step, Switch):
            total += max((serial_statements(b, repeat) for b in step.branches), default=0)
        elif isinstance(step, Assign):
            total += repeat
        else:
            total += repeat
    return total


def warps_for(largest: int) -> int:
    return 1 if largest <= 512 else 2 if largest <= 2048 else 4


def waves_of(programs: int) -> int:
    """How many waves ``programs`` programs take on the device (at least one)."""
    return -(-max(1, programs) // (DEVICE_SMS * PROGRAMS_PER_SM))


def rounds_of(tile: int) -> int:
    """Elements per thread of a ``tile``-element tile on the warps it gets (at least one)."""
    tile = max(1, tile)
    return -(-tile // (WARP * warps_for(tile)))


def _floor_pow2(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def lanes_for(chains: int, outer: int, largest: int, registers: int) -> Tuple[int, str]:
    """Chains per program (L, a power of two) for a batch level of ``chains`` chains
    (``outer``: the elements of the batch levels around it, each its own programs) whose
    one-chain program has ``largest`` elements in its largest tile and ``registers``
    in all; and the reason in words.  The rule is the module's docstring's."""
    chains, outer = max(1, int(chains)), max(1, int(outer))
    largest, registers = max(1, int(largest)), max(1, int(registers))
    fit = 1
    while fit * 2 <= chains * 2 - 1 and 2 * fit * largest <= TILE_LIMIT and \
            2 * fit * registers <= REGISTER_LIMIT:
        fit *= 2              # up to the power of two at or above the chains
    if chains == 1:
        return 1, "one chain"
    forced = os.environ.get(LANES_ENV)
    if forced:
        try:
            wanted = _floor_pow2(int(forced))
        except ValueError:
            wanted = 0
        if wanted >= 1:
            lanes = min(wanted, fit)
            return lanes, (f"{LANES_ENV}={forced} asks for {wanted} lane(s)" +
                           (f", {fit} fit one program" if fit < wanted else ""))

    def cost(lanes):
        return waves_of(outer * -(-chains // lanes)) * rounds_of(lanes * largest)
    best, lanes = None, 1
    while lanes <= fit:
        if best is None or cost(lanes) <= cost(best):
            best = lanes
        lanes *= 2
    rule = (f"waves of programs x elements per thread of the largest tile "
            f"({largest} per chain): {cost(1)} at one chain per program")
    if best == 1:
        return 1, (f"{rule}, no fewer with lanes (up to {fit} fit one program)")
    return best, f"{rule}, {cost(best)} at {best} (up to {fit} fit one program)"


def spread_over_chains(whole: DeviceChoice, whole_largest: int, serial: int,
                       chain: DeviceChoice, chain_programs: int, chain_largest: int,
                       sums: int, summed_in_kernel: int = 0) -> Tuple[bool, str]:
    """Whether a function of a whole batch of chains (one program: ``whole``, its
    largest tile ``whole_largest``) runs instead as its one-chain program spread over
    ``chain_programs`` programs (``chain``: that kernel's own choice; ``chain_largest``:
    the largest tile of one of its programs, lanes included) followed by ``sums``
    fixed-order sum kernels, its last program adding ``summed_in_kernel`` blocks of
    terms one after another (the sums in the same launch: chains x dtypes); and why.  The rule: where the whole program runs no Triton
    kernel and the spread one does, spread; where both do, the smaller of
    serial statements x rounds (elements of the largest tile per thread) x waves of
    programs, plus a launch for each sum kernel and a statement for each block the
    last program adds, in DEVICE_NS_PER_STATEMENT and LAUNCH_US.  ``EINFUSE_JIT_CHAINS`` = 1 / 0 forces it / forbids it."""
    forced = os.environ.get(CHAINS_ENV)
    if not chain.triton:
        return False, f"its one-chain kernel would not run ({chain.reason})"
    if forced in ("0", "1"):
        return forced == "1", f"{CHAINS_ENV}={forced} asks for it"
    if not whole.triton:
        return True, "the program of the whole batch runs no Triton kernel"
    waves = waves_of(chain_programs)
    whole_us = serial * rounds_of(whole_largest) * DEVICE_NS_PER_STATEMENT / 1000.0
    spread_us = serial * rounds_of(chain_largest) * waves * DEVICE_NS_PER_STATEMENT / \
        1000.0 + sums * LAUNCH_US + summed_in_kernel * DEVICE_NS_PER_STATEMENT / 1000.0
    summed = f", {summed_in_kernel} blocks summed in the launch" if summed_in_kernel else ""
    rule = (f"statements x rounds x waves: {whole_us:.1f} us as one program of the whole "
            f"batch ({whole_largest}-element tiles) against {spread_us:.1f} us spread "
            f"({chain_largest}-element tiles, {waves} wave(s), {sums} sum launch(es)"
            f"{summed})")
    return spread_us < whole_us, rule


def estimates(program: JitProgram, batch: int, on_gpu: bool, programs: Optional[int] = None):
    """(host microseconds, device microseconds) by the rule above; ``programs``: how
    many the kernel launches (default one per batch element; fewer over lanes), the
    waves counted over them (a statement's time is taken as the same with lanes:
    :func:`lanes_for` chose them only where they cost no more rounds in all)."""
    if batch > 1:
        threads = min(default_threads(), max(1, batch // 8))
        per_op = HOST_NS_PER_BATCHED_OP / max(1.0, THREAD_EFFICIENCY * threads)
    else:
        per_op = HOST_NS_PER_OP
    host = typed_work(program.steps) * max(1, batch) * per_op / 1000.0
    if on_gpu:
        nbytes = sum(b.size * b.dtype.numpy.itemsize for b in program.buffers
                     if b.name in program.inputs or b.name in program.outputs) * max(1, batch)
        host += COPY_US + nbytes / (COPY_GB_PER_S * 1000.0)
    waves = waves_of(batch if programs is None else programs)
    device = LAUNCH_US + serial_statements(program.steps) * DEVICE_NS_PER_STATEMENT / 1000.0 \
        * waves
    return host, device


def choose(program: JitProgram, batch: int, backend: str, on_gpu: bool, can_run: bool,
           declined: Optional[str], largest: int = 0, registers: int = 0,
           programs: Optional[int] = None, spread: str = "") -> DeviceChoice:
    """Host or Triton for ``program`` over ``batch`` elements (1: not vmapped).
    ``on_gpu``: the arrays live on a GPU; ``can_run``: a Triton kernel can run here (a
    GPU, or the interpreter); ``declined``: the renderer's reason where it declined;
    ``largest``/``registers``: its tile sizes where it did not; ``programs``: how many
    it launches (default: one per batch element) and ``spread`` how the batch is laid
    over them and their lanes, in words (:func:`lanes_for`)."""
    if backend == "c":
        return DeviceChoice(False, 'backend="c" asks for it')
    if backend == "auto" and not on_gpu:
        return DeviceChoice(False, "the arrays are on the host, where the C kernel runs on "
                                   "them as they are")
    if not can_run:
        return DeviceChoice(False, "Triton cannot run here (no GPU, and TRITON_INTERPRET "
                                   "is not 1)")
    if declined is not None:
        return DeviceChoice(False, f"the Triton renderer declines: {declined}")
    if largest > TILE_LIMIT or registers > REGISTER_LIMIT:
        return DeviceChoice(False, f"its tiles ({largest} elements, {registers} in all) "
                                   f"exceed one program's registers ({TILE_LIMIT}, "
                                   f"{REGISTER_LIMIT})")
    warps = warps_for(largest)
    programs = max(1, batch) if programs is None else programs
    layout = f"{programs} program(s), {warps} warp(s) each" + (f"; {spread}" if spread else "")
    if backend == "triton":
        return DeviceChoice(True, f'backend="triton" asks for it; {layout}', warps)
    host, device = estimates(program, batch, on_gpu, programs)
    rule = (f"estimated host {host:.1f} us (operations x batch, copies) against device "
            f"{device:.1f} us (launch + serial statements x waves)")
    if device < host:
        return DeviceChoice(True, f"{rule}: the device is faster; {layout}", warps)
    return DeviceChoice(False, f"{rule}: the host is faster")


__all__ = ["BACKENDS", "CHAINS_ENV", "DeviceChoice", "LANES_ENV", "choose", "estimates",
           "lanes_for", "serial_statements", "spread_over_chains"]
