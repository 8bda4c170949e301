"""Where the microseconds of a repeated torch CPU call go (issue 32 item 2): per layer,
with the kernels really launched, one thread, CPU time (time.process_time), medians of
interleaved repeats.  Cases: the Linear+ReLU statement 32x128x128 (its schedule runs
BLAS, then the epilogue: runtime/epilogue_chain.py), a 256x256 softmax program, and a
4x4 product statement; each with no grad and with autograd recording (inputs that
require a gradient, grad mode on: the forward only, the node recorded; and ``step``, the
forward and its backward, against torch's ``torch step``).  The warm-up calls are
forwards only: a recorded signature that reaches no backward takes the C++ node after
a few forwards (schedule/torch_node_plan.plan_before_backward), as one with a backward
does at its first.

Layers of a statement call (Kernel.__call__'s fast path): ``compiling`` (is
torch.compile tracing: torch_compiling), ``signature`` (signature_of over the call's
arguments), ``lookup`` (the prepared-runner dict), ``runner`` (the prepared runner: the
kernel call and its result tensor); ``call`` is the whole ``k(**args)``; ``rest`` what
the call costs beyond those layers.  A program call: ``signature``, ``apply`` (its
prepared call), ``call``.

    PYTHONPATH=src python benchmarks/call_overhead.py [repeats] [case substring]"""

import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import einfuse as ef  # noqa: E402
from einfuse.analysis.frameworks import torch_compiling  # noqa: E402
from einfuse.backends.c import torch_node  # noqa: E402
from einfuse.runtime.signatures import signature_of  # noqa: E402

torch.set_num_threads(1)
LINEAR_RELU = "y[b,o] := max(sum[i](x[b,i] * W[o,i]) + c[o], 0)"
PRODUCT = "C[i,k] := sum[j](A[i,j] * B[j,k])"
SOFTMAX = ("M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\n"
           "Z[i] := sum[j](E[i,j])\nP[i,j] := E[i,j] / Z[i]")
CALLS = 2000      # calls per timed loop


def per_call(fn, calls=CALLS) -> float:
    """CPU microseconds per call of ``fn``."""
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e6


def tensors(shapes, grad):
    rng = np.random.default_rng(0)
    return {name: torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))
            .requires_grad_(grad) for name, shape in shapes.items()}


def steps(fn, peer, args):
    """The forward and its backward of ``fn`` and of torch's ``peer`` on ``args``."""
    def step(of):
        def run():
            for value in args.values():
                value.grad = None
            of(args).sum().backward()
        return run
    return {"step": step(fn), "torch step": step(peer)}


def statement_layers(statement, shapes, peer, grad):
    kernel = ef.compile(statement, backend="c")
    args = tensors(shapes, grad)
    for _ in range(200):      # prepared, and the C++ node loaded where it is used
        kernel(**args)
    signature = signature_of(args)
    runner = kernel._repeat.get(signature)
    assert runner is not None, "no prepared runner: the fast path is not taken"
    cache = kernel._repeat
    layers = {"call": lambda: kernel(**args),
              "compiling": torch_compiling,
              "signature": lambda: signature_of(args),
              "lookup": lambda: cache.get(signature),
              "runner": lambda: runner(args),
              "torch": lambda: peer(args)}
    if grad:
        layers.update(steps(lambda a: kernel(**a), peer, args))
    return layers


def program_layers(source, outputs, shapes, peer, grad):
    program = ef.compile(source, outputs=outputs, backend="c")
    args = tensors(shapes, grad)
    for _ in range(200):
        program(**args)
    layers = {"call": lambda: program(**args),
              "signature": lambda: signature_of(args),
              "torch": lambda: peer(args)}
    calls = program.__dict__.get("_recorded_calls")
    prepared = calls.get(signature_of(args)) if calls else None
    if prepared is not None:
        layers["apply"] = lambda: prepared.apply(args)
    if grad:
        layers.update(steps(lambda a: program(**a), peer, args))
    return layers


CASES = {
    "linear+relu 32x128x128": lambda grad: statement_layers(
        LINEAR_RELU, dict(x=(32, 128), W=(128, 128), c=(128,)),
        lambda a: torch.relu(torch.addmm(a["c"], a["x"], a["W"].t())), grad),
    "product 4x4": lambda grad: statement_layers(
        PRODUCT, dict(A=(4, 4), B=(4, 4)), lambda a: a["A"] @ a["B"], grad),
    "softmax program 256x256": lambda grad: program_layers(
        SOFTMAX, ("P",), dict(X=(256, 256)), lambda a: torch.softmax(a["X"], 1), grad),
}


def main(repeats: int, only: str = "") -> None:
    torch_node.module(wait=True)     # (built before the warm-up calls: their node in use)
    print(f"load average {os.getloadavg()}; one thread; CPU us per call, median of "
          f"{repeats} interleaved repeats of {CALLS} calls")
    for name, make in CASES.items():
        for grad in (False, True):
            if only not in f"{name} [{'recorded' if grad else 'no grad'}]":
                continue
            layers = make(grad)
            times = {layer: [] for layer in layers}
            for _ in range(repeats):
                for layer, fn in layers.items():
                    times[layer].append(per_call(fn))
            median = {layer: float(np.median(t)) for layer, t in times.items()}
            parts = sum(median[k] for k in ("compiling", "signature", "lookup", "runner",
                                            "apply") if k in median)
            shown = ", ".join(f"{k} {v:.2f}" for k, v in median.items())
            stepped = f"; step/torch step {median['step'] / median['torch step']:.2f}x" \
                if "step" in median else ""
            print(f"{name} [{'recorded' if grad else 'no grad'}]: {shown}; "
                  f"rest {median['call'] - parts:.2f}; "
                  f"call/torch {median['call'] / median['torch']:.2f}x{stepped}")
    print(f"load average after {os.getloadavg()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, *sys.argv[2:3])
