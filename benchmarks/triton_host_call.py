"""Host time per repeated call on the Triton backend (issue 36 item 3), the kernels
stubbed: every launch einfuse makes goes through backends/triton/launch.py, and inside
``launch.stubbed()`` a launch is counted but not run, so what is timed is einfuse's own
host path of a repeated call -- the signature look-up, the prepared runner, the output
allocation, the prepared launch -- and neither the interpreter nor a GPU.

Runs under TRITON_INTERPRET=1 on CPU tensors (set below; no GPU needed).  CPU time of
this process (time.process_time), one thread, the cases interleaved, the median of
several rounds.  Run:

    PYTHONPATH=src python benchmarks/triton_host_call.py

Prints one Markdown row per case: the call as a user makes it, then its pieces (the
call signature's look-up, one output allocation, the stubbed prepared launch) and
torch's own op on the same tensor for scale; last, torch's floor for any Python
autograd node (a Function that only allocates), forward and forward + backward, which
a recorded call's time includes (einfuse's own part is the difference).

Before and after a change, in one run:

    PYTHONPATH=src python benchmarks/triton_host_call.py --before /path/to/other/src

runs the softmax program's repeated calls (no grad, recorded forward, forward +
backward) and torch's floor in a child process per side, the sides alternated
(``--runs`` each), each side's own einfuse (``--before``'s and this PYTHONPATH's),
and prints the medians and einfuse's own part (the recorded calls less the floor)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.backends.triton import launch  # noqa: E402
from einfuse.runtime.signatures import signature_of  # noqa: E402

torch.set_num_threads(1)
ROUNDS, CALLS = 15, 2000


def per_call_us(fns):
    """Median over ROUNDS of each function's CPU time per call, in microseconds; the
    functions timed in turn within each round (the machine is shared)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(ROUNDS):
        for number, fn in enumerate(fns):
            start = time.process_time()
            for _ in range(CALLS):
                fn()
            times[number].append((time.process_time() - start) / CALLS * 1e6)
    return [statistics.median(t) for t in times]


def main():
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((8, 16)).astype(np.float32))
    statement = ef.compile("y[i,j] := x[i,j] * 2.0 + 1.0", backend="triton")
    scaled = ef.compile("y[i,j] := x[i,j] * a + 1.0", backend="triton")
    softmax = ef.compile("m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n"
                         "P[i,j] := e[i,j] / sum[k](e[i,k])", backend="triton")
    entropy = ef.compile("L[i] := logsumexp[j](X[i,j]) - X[i, t[i]]", backend="triton")
    labels = torch.from_numpy(rng.integers(0, 16, 8))
    row_seed = torch.ones(8)
    cases = [
        ("statement `y[i,j] := x[i,j] * 2.0 + 1.0`", lambda: statement(x=x),
         {"x": x}, lambda: x * 2.0 + 1.0),
        ("statement with a scalar parameter `x * a + 1`", lambda: scaled(x=x, a=0.5),
         {"x": x, "a": 0.5}, lambda: x * 0.5 + 1.0),
        ("softmax program (3 statements, one row-group kernel), no grad",
         lambda: softmax(X=x), {"X": x}, lambda: torch.softmax(x, 1)),
        ("gathered statement: cross-entropy `logsumexp - X[i, t[i]]`, no grad "
         "(labels checked per call)", lambda: entropy(X=x, t=labels),
         {"X": x, "t": labels},
         lambda: torch.nn.functional.cross_entropy(x, labels, reduction="none")),
    ]
    leaf = x.clone().requires_grad_(True)
    seed = torch.ones_like(x)
    reference = x.clone().requires_grad_(True)

    def recorded_forward():
        return softmax(X=leaf)

    def recorded_step():
        softmax(X=leaf).backward(seed)

    def torch_step():
        torch.softmax(reference, 1).backward(seed)
    def entropy_forward():
        return entropy(X=leaf, t=labels)

    def entropy_step():
        entropy(X=leaf, t=labels).backward(row_seed)

    def torch_entropy_step():
        torch.nn.functional.cross_entropy(reference, labels, reduction="none").backward(
            row_seed)

    def node_forward():
        return _EmptyNode.apply(None, leaf)

    def node_step():
        _EmptyNode.apply(None, leaf).backward(seed)
    recorded = [
        ("softmax program, recorded forward (one autograd node, one kernel)",
         recorded_forward, {"X": leaf}, lambda: torch.softmax(reference, 1)),
        ("softmax program, forward + backward (one kernel each)", recorded_step,
         {"X": leaf}, torch_step),
        ("cross-entropy statement, recorded forward (one-statement program node)",
         entropy_forward, {"X": leaf},
         lambda: torch.nn.functional.cross_entropy(reference, labels, reduction="none")),
        ("cross-entropy statement, forward + backward (one kernel each)", entropy_step,
         {"X": leaf}, torch_entropy_step),
        ("torch's floor: a Python autograd.Function that only allocates, forward",
         node_forward, {"X": leaf}, lambda: torch.softmax(reference, 1)),
        ("torch's floor: that Function, forward + backward", node_step, {"X": leaf},
         torch_step)]
    for _, call, _, _ in recorded:
        for _ in range(3):
            call()
    with launch.observed() as seen_recorded:
        recorded_step()
    with launch.stubbed():
        recorded_totals = per_call_us([case[1] for case in recorded])
    recorded_peers = per_call_us([case[3] for case in recorded])
    with torch.no_grad():
        for _, call, _, _ in cases:     # the first calls compile, group and prepare
            for _ in range(3):
                call()
        with launch.observed() as seen:
            for _, call, _, _ in cases:
                call()
        launches = {}
        for record in seen:
            launches[record.kernel] = launches.get(record.kernel, 0) + 1
        prepared = launch.PreparedLaunch(_Stand(), (1,), {}, {})
        direct = _direct_launch()
        # the softmax's row-group runner (its prepared run's one step)
        # (an unrecorded call's run is kept by the program's autograd owner)
        owner = next(iter(softmax.__dict__["_autograd"].values()))
        step = next(iter(owner.runs.values())).steps[0]
        rows_runner, env = step.run.args[0], {"X": x}
        out_shape = tuple(x.shape)
        with launch.stubbed():
            pieces = per_call_us([
                lambda: signature_of({"x": x}),
                lambda: torch.empty(out_shape, dtype=torch.float32),
                lambda: prepared(x, 0.5, 8, 16, x),
                lambda: rows_runner(env)])
            totals = per_call_us([case[1] for case in cases])
        # (outside the stub: the direct path's own work, its compiled launcher a no-op)
        pieces += per_call_us([lambda: direct(x, 0.5, 8, 16, x)])
        peers = per_call_us([case[3] for case in cases])
    print("host time per repeated call, kernels stubbed (TRITON_INTERPRET=1, CPU time, "
          f"median of {ROUNDS} rounds of {CALLS} calls)")
    print(f"launches per call: {sum(launches.values()) / len(cases):.0f} "
          f"({', '.join(f'{k}: {v}' for k, v in sorted(launches.items()))})")
    print("| call | einfuse host path | torch's op (runs it) | ratio |")
    print("|---|---|---|---|")
    for (name, *_), total, peer in zip(cases + recorded, totals + recorded_totals,
                                       peers + recorded_peers):
        print(f"| {name} | {total:.1f} us | {peer:.1f} us | {total / peer:.2f}x |")
    print(f"forward + backward launches: {len(seen_recorded)} "
          f"({', '.join(r.kernel for r in seen_recorded)})")
    print(f"pieces: signature look-up {pieces[0]:.1f} us, output allocation "
          f"{pieces[1]:.1f} us, stubbed prepared launch {pieces[2]:.1f} us, the softmax's "
          f"row-group runner (stubbed launch) {pieces[3]:.1f} us; the GPU path's direct "
          f"launch with a no-op compiled launcher (the specialisation check, the "
          f"metadata, the call) {pieces[4]:.1f} us")


class _EmptyNode(torch.autograd.Function):
    """What any Python autograd node costs torch per call: its forward saves the input
    and allocates the output, its backward allocates the gradient (einfuse's part of a
    recorded call is its time less this)."""

    @staticmethod
    def forward(ctx, state, tensor):
        ctx.save_for_backward(tensor)
        return torch.empty_like(tensor)

    @staticmethod
    def backward(ctx, grad):
        (tensor,) = ctx.saved_tensors
        return None, torch.empty_like(tensor)


class _NoOpCompiled:
    """A compiled kernel whose launcher does nothing: what the direct path costs on
    the host before the driver's launch (about 7 us more on an H100)."""
    function, packed_metadata = None, None

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        return None


class _NoOpJIT:
    params = [type("P", (), {"name": n})() for n in ("x", "s", "m", "n", "out", "BLOCK")]

    def __getitem__(self, grid):
        return lambda *args, **options: _NoOpCompiled()


def _direct_launch():
    """A prepared launch on the direct path (its first call adopted the no-op compiled
    kernel; the driver's stream look-up replaced, there is no GPU here)."""
    launch.stream_getter = lambda: (lambda index: None)
    prepared = launch.PreparedLaunch(_NoOpJIT(), (4, 1), {"num_warps": 4}, {"BLOCK": 64})
    x = torch.zeros(8, 16)
    prepared(x, 0.5, 8, 16, x)
    assert prepared.direct
    return prepared


class _Stand:
    """A kernel that is never launched (the launch is stubbed): measures the prepared
    launch's own bookkeeping."""
    fn = None

    def __getitem__(self, grid):
        raise AssertionError("stubbed launches never reach the kernel")


SOFTMAX = ("m[i] := max[j](X[i,j])\ne[i,j] := exp(X[i,j] - m[i])\n"
           "P[i,j] := e[i,j] / sum[k](e[i,k])")
SUMMARY = ("no grad", "recorded forward", "forward + backward", "floor forward",
           "floor forward + backward")


def summary():
    """The softmax program's repeated calls on 8 x 16 float32 tensors and torch's floor
    (the empty Function), launches stubbed: one JSON line, microseconds per call."""
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((8, 16)).astype(
        np.float32))
    softmax = ef.compile(SOFTMAX, backend="triton")
    leaf = x.clone().requires_grad_(True)
    seed = torch.ones_like(x)
    calls = [lambda: softmax(X=x), lambda: softmax(X=leaf),
             lambda: softmax(X=leaf).backward(seed),
             lambda: _EmptyNode.apply(None, leaf),
             lambda: _EmptyNode.apply(None, leaf).backward(seed)]
    for call in calls:          # the first calls compile, plan and prepare
        for _ in range(3):
            call()
    with launch.stubbed():
        times = per_call_us(calls)
    print(json.dumps(dict(zip(SUMMARY, times))))


def compare(before: str, runs: int):
    """``summary`` in a child process per side (``before``: the other einfuse's src
    folder), the sides alternated ``runs`` times; the medians, side by side."""
    here = os.path.abspath(__file__)
    sides = {"before": before, "after": os.environ.get("PYTHONPATH", "")}
    found = {side: [] for side in sides}
    for _ in range(runs):
        for side, path in sides.items():
            child = subprocess.run([sys.executable, here, "--summary"], check=True,
                                   capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": path})
            found[side].append(json.loads(child.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"softmax program on 8 x 16 float32, launches stubbed, CPU time per call "
          f"(medians of {runs} alternated runs of {ROUNDS} rounds x {CALLS} calls; "
          f"load average {load:.1f})")
    print("| call | before | after | after / before |")
    print("|---|---|---|---|")
    medians = {side: {name: statistics.median(run[name] for run in runs_)
                      for name in SUMMARY} for side, runs_ in found.items()}
    rows = [(name, medians["before"][name], medians["after"][name]) for name in SUMMARY]
    for own, total, floor in (("einfuse's own part, recorded forward", 1, 3),
                              ("einfuse's own part, forward + backward", 2, 4)):
        rows.append((own,) + tuple(medians[side][SUMMARY[total]] -
                                   medians[side][SUMMARY[floor]]
                                   for side in ("before", "after")))
    for name, old, new in rows:
        print(f"| {name} | {old:.1f} us | {new:.1f} us | {new / old:.2f}x |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="another einfuse's src folder to compare with")
    parser.add_argument("--runs", type=int, default=3, help="child runs per side")
    parser.add_argument("--summary", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.summary:
        summary()
    elif options.before:
        compare(options.before, options.runs)
    else:
        main()
