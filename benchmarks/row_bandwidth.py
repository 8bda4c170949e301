"""Row operations against the machine's copy bandwidth (issue 31, item 6): softmax,
layernorm, RMSNorm, logsumexp and cross-entropy over the rows of a float32 matrix
(4096x1024 by default: 16 MiB, one read of it is what each must move), each as an
einfuse program on NumPy arrays, against torch eager and torch.compile (inductor).

Each row's effective bandwidth is the bytes the operation must move (its inputs read
once, its outputs written once) over its time; the copy bandwidth is NumPy's copy of
the same matrix into another (``np.copyto``: 2 x 16 MiB moved), measured in the same
interleaved rounds.  One thread (OMP_NUM_THREADS=1, torch.set_num_threads(1)), CPU time
(time.process_time), the contenders interleaved, the median over the repeats.
``--before REV`` runs the einfuse side on that revision's src/ too (a child process
each, the same rounds), so one run gives before and after.

    PYTHONPATH=src python benchmarks/row_bandwidth.py --before HEAD~3
"""

from __future__ import annotations

import argparse
import json
import os

from before_after import interleaved, run_child, source_trees

EPS = "1e-05"


def programs(cols: int, rows: int = 4096) -> dict:
    """name -> (program text, torch twin, the bytes it must move per row)."""
    return {
        "softmax": ("M[i] := max[j](X[i,j])\nE[i,j] := exp(X[i,j] - M[i])\n"
                    "Z[i] := sum[j](E[i,j])\nP[i,j] := E[i,j] / Z[i]",
                    "softmax", 8 * cols),
        "layernorm": (f"m[i] := sum[j](X[i,j]) / {cols}\n"
                      f"v[i] := sum[j]((X[i,j] - m[i])**2) / {cols}\n"
                      f"Y[i,j] := (X[i,j] - m[i]) / sqrt(v[i] + {EPS}) * g[j] + b[j]",
                      "layernorm", 8 * cols),
        "rmsnorm": (f"r[i] := sqrt(sum[j](X[i,j]**2) / {cols} + {EPS})\n"
                    "Y[i,j] := X[i,j] / r[i] * g[j]", "rmsnorm", 8 * cols),
        "logsumexp": ("z[i] := logsumexp[j](X[i,j])", "logsumexp", 4 * cols + 4),
        "cross-entropy": ("m[i] := max[j](X[i,j])\n"
                          "l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]",
                          "cross_entropy", 4 * cols + 8 + 4),
        # the other spellings users write (plan/row_statistics.py takes each)
        "lse (max+log)": ("m[i] := max[j](X[i,j])\n"
                          "l[i] := m[i] + log(sum[j](exp(X[i,j] - m[i])))",
                          "logsumexp", 4 * cols + 4),
        "ce (one stmt)": ("l[i] := logsumexp[j](X[i,j]) - X[i, t[i]]",
                          "cross_entropy", 4 * cols + 8 + 4),
        "ce mean": ("m[i] := max[j](X[i,j])\n"
                    "l[i] := log(sum[j](exp(X[i,j] - m[i]))) + m[i] - X[i, t[i]]\n"
                    f"L[] := sum[i](l[i]) / {rows}", "cross_entropy_mean", 4 * cols + 8),
        "ce mean (1 st)": (f"L[] := sum[i](logsumexp[j](X[i,j]) - X[i, t[i]]) / {rows}",
                           "cross_entropy_mean", 4 * cols + 8),
        "log-softmax": ("Y[i,j] := X[i,j] - logsumexp[k](X[i,k])", "log_softmax", 8 * cols),
    }


def torch_twin(kind: str, cols: int):
    import torch
    F = torch.nn.functional
    return {"softmax": lambda X, g, b, t: torch.softmax(X, 1),
            "layernorm": lambda X, g, b, t: F.layer_norm(X, (cols,), g, b, float(EPS)),
            "rmsnorm": lambda X, g, b, t: F.rms_norm(X, (cols,), g, float(EPS)),
            "logsumexp": lambda X, g, b, t: torch.logsumexp(X, 1),
            "cross_entropy": lambda X, g, b, t: F.cross_entropy(X, t, reduction="none"),
            "cross_entropy_mean": lambda X, g, b, t: F.cross_entropy(X, t),
            "log_softmax": lambda X, g, b, t: torch.log_softmax(X, 1),
            }[kind]


def inputs(rows: int, cols: int):
    import numpy as np
    rng = np.random.default_rng(0)
    return {"X": rng.standard_normal((rows, cols), dtype=np.float32),
            "g": rng.standard_normal(cols, dtype=np.float32),
            "b": rng.standard_normal(cols, dtype=np.float32),
            "t": rng.integers(0, cols, rows)}


def einfuse_contenders(rows: int, cols: int) -> dict:
    import numpy as np
    import einfuse as ef
    arrays = inputs(rows, cols)
    found = {"copy": ("copy", _copy(arrays["X"]))}
    for name, (text, _, _) in programs(cols, rows).items():
        program = ef.compile(text)
        given = {k: v for k, v in arrays.items() if f"{k}[" in text}
        found[name] = (name, (lambda p=program, a=given: p(**a)))
    return found


def _copy(x):
    import numpy as np
    out = np.empty_like(x)
    return lambda: np.copyto(out, x)


def torch_contenders(rows: int, cols: int) -> dict:
    import torch
    torch.set_num_threads(1)
    arrays = {k: torch.from_numpy(v) for k, v in inputs(rows, cols).items()}
    found = {}
    for name, (_, kind, _) in programs(cols, rows).items():
        eager = torch_twin(kind, cols)
        compiled = torch.compile(eager)
        with torch.no_grad():
            found[f"{name}: torch eager"] = (name, _no_grad(eager, arrays))
            found[f"{name}: torch.compile"] = (name, _no_grad(compiled, arrays))
    return found


def _no_grad(fn, arrays):
    import torch

    def run():
        with torch.no_grad():
            fn(**arrays)
    return run


def check(rows: int, cols: int) -> None:
    """Each program's values against its torch twin (before any timing)."""
    import numpy as np
    import torch
    import einfuse as ef
    arrays = inputs(rows, cols)
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    for name, (text, kind, _) in programs(cols, rows).items():
        given = {k: v for k, v in arrays.items() if f"{k}[" in text}
        result = ef.compile(text)(**given)
        mine = result[-1] if isinstance(result, (tuple, list)) else result
        mine = np.asarray(mine)
        theirs = torch_twin(kind, cols)(**tensors).numpy()
        assert np.allclose(mine, theirs, rtol=1e-4, atol=1e-5), name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--before", default="", help="a git revision to measure too")
    parser.add_argument("--torch", action="store_true", help="also torch eager/compile")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--with-torch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        check(min(args.rows, 64), args.cols)
        found = einfuse_contenders(args.rows, args.cols)
        if args.with_torch:
            found.update(torch_contenders(args.rows, args.cols))
        print(json.dumps(interleaved(found, args.repeats, args.calls)))
        return
    common = ["--rows", str(args.rows), "--cols", str(args.cols),
              "--repeats", str(args.repeats), "--calls", str(args.calls)]
    runs = {}
    with source_trees(args.before) as trees:
        for label, src in trees.items():
            last = label.startswith("after") and args.torch
            runs[label] = run_child(__file__, src,
                                    common + (["--with-torch"] if last else []))
    report(runs, args.rows, args.cols)


def report(runs: dict, rows: int, cols: int) -> None:
    copies = [r["copy"]["seconds"] for label, r in runs.items() if "copy" in r]
    copy_seconds = sorted(copies)[len(copies) // 2]
    copy_bw = 2 * rows * cols * 4 / copy_seconds / 1e9
    print(f"copy (np.copyto, {rows}x{cols} float32): {copy_seconds * 1e3:.3f} ms, "
          f"{copy_bw:.1f} GB/s (read + write); load {os.getloadavg()[0]:.1f}")
    torch_times = runs["after (this tree)"]
    for name, (_, _, per_row) in programs(cols, rows).items():
        moved = per_row * rows
        line = [f"{name:14s}"]
        for label, results in runs.items():
            s = results[name]["seconds"]
            line.append(f"{label.split(' ')[0]}: {s * 1e3:7.3f} ms {moved / s / 1e9:5.1f} GB/s "
                        f"{100 * moved / s / 1e9 / copy_bw:4.0f}%")
        after = runs["after (this tree)"][name]["seconds"]
        for peer in ("torch eager", "torch.compile"):
            row = torch_times.get(f"{name}: {peer}")
            if row:
                line.append(f"{peer} {row['seconds'] * 1e3:7.3f} ms (x{row['seconds'] / after:4.2f})")
        print("  ".join(line))


if __name__ == "__main__":
    main()
