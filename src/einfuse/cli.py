"""The ``einfuse`` command: ``einfuse explain "STATEMENT" --shape A=100x50 ...``."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Dict, Optional, Sequence, Tuple

from .errors import EinfuseError


def _shape(text: str) -> Tuple[str, Tuple[int, ...]]:
    name, sep, dims = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"--shape takes NAME=AxBxC, not {text!r}")
    try:
        shape = tuple(int(d) for d in dims.split("x")) if dims not in ("", "()") else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: sizes must be integers "
                                         "joined by 'x', e.g. A=100x50") from None
    if any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"--shape {text!r}: sizes cannot be negative")
    return name, shape


def _range(text: str):
    name, sep, value = text.partition("=")
    try:
        if not sep or not name.isidentifier():
            raise ValueError
        if ":" in value:
            start, stop = value.split(":")
            return name, range(int(start), int(stop))
        return name, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--range takes NAME=N or NAME=START:STOP, not "
                                         f"{text!r}") from None


def _param(text: str):
    name, sep, value = text.partition("=")
    try:
        if not sep or not name.isidentifier():
            raise ValueError
        return name, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--param takes NAME=NUMBER, not {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="einfuse", description="Tensor index notation "
                                     "compiled to fused kernels.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"einfuse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    cache = sub.add_parser("cache", help="the compiled-kernel cache: where it is and what it "
                           "holds (info), or empty it (clear)")
    cache.add_argument("action", choices=["info", "clear"])
    explain = sub.add_parser("explain", help="explain what a statement computes, what it "
                             "costs and how it runs")
    explain.add_argument("statement")
    explain.add_argument("--shape", action="append", type=_shape, default=[],
                         metavar="NAME=AxB", help="shape of a tensor, e.g. A=100x50")
    explain.add_argument("--range", action="append", type=_range, default=[],
                         metavar="I=N|I=A:B", help="an index range, e.g. i=10 or i=2:12")
    explain.add_argument("--param", action="append", type=_param, default=[],
                         metavar="NAME=X", help="value of a scalar parameter")
    explain.add_argument("--pad", type=float, default=None)
    explain.add_argument("--bounds", default="check",
                         choices=["check", "clip", "wrap", "fill", "promise"])
    explain.add_argument("--fill", type=float, default=0.0,
                         help="the value read under --bounds fill (default 0)")
    explain.add_argument("--dtype", default=None)
    explain.add_argument("--backend", default="auto")
    explain.add_argument("--gradients", action="store_true",
                         help="also show every gradient statement and its plan")
    explain.add_argument("--source", action="store_true",
                         help="also show the generated C or Triton source (needs --shape)")
    explain.add_argument("--measure", action="store_true",
                         help="also time it on this machine (zero-filled arrays of the "
                         "--shape sizes)")
    explain.add_argument("--html", default=None, metavar="FILE",
                         help="also write the picture of the plan as a self-contained HTML "
                         "page (docs/pictures.md)")
    bench = sub.add_parser("bench", help="time einfuse against the installed peers "
                           "(NumPy, PyTorch, JAX, pykeops) and print ratios")
    bench.add_argument("--case", action="append", default=[], metavar="NAME",
                       help="run only cases whose name starts with NAME (repeatable)")
    bench.add_argument("--peer", action="append", default=None, metavar="NAME",
                       help="run only peers whose name contains NAME (repeatable)")
    bench.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    bench.add_argument("--backend", default="auto",
                       help="einfuse backend (auto: Triton for CUDA tensors, else C)")
    bench.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                       help="cpu (default): the CPU cases; cuda: the GPU cases, einfuse's "
                       "Triton backend on CUDA tensors against GPU peers")
    bench.add_argument("--budget", type=float, default=3.0,
                       help="seconds of repeated timing per implementation (default 3)")
    bench.add_argument("--out", default=None, metavar="DIR",
                       help="write bench.md (gpu.md with --device cuda), and the chart "
                       "with --plot, into DIR")
    bench.add_argument("--plot", action="store_true", help="also draw a bar chart (PNG)")
    bench.add_argument("--html", default=None, metavar="FILE",
                       help="also write the results as an HTML page (tables and charts)")
    calibrate = sub.add_parser("calibrate", help="measure this machine's memory bandwidth "
                               "and FLOP rate for the pictures' rooflines, and cache them")
    calibrate.add_argument("--show", action="store_true",
                           help="print the cached calibration (measure only if none)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    if args.command == "explain":
        return _explain(args)
    if args.command == "bench":
        return _bench(args)
    if args.command == "cache":
        return _cache(args.action)
    if args.command == "calibrate":
        return _calibrate(args.show)
    return 2  # argparse rejects unknown commands before this


def _cache(action: str) -> int:
    """``einfuse cache info|clear``: the cache directory, its entries (compiled C
    libraries, Triton kernel sources, the Triton tuning file) and their size."""
    import os
    from .backends import disk_cache
    try:
        where = disk_cache.cache_dir()
    except EinfuseError as error:
        print(f"einfuse: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    entries = sorted(os.listdir(where))
    kinds = {"C libraries": [e for e in entries if e.endswith(".so")],
             "Triton kernels": [e for e in entries if e.startswith("einfuse_triton_")
                                and e.endswith(".py")],
             "tuning files": [e for e in entries if e.endswith(".json")]}
    sizes = {e: os.path.getsize(os.path.join(where, e)) for e in entries
             if os.path.isfile(os.path.join(where, e))}
    total = sum(sizes.values())
    if action == "info":
        print(f"location  {where}")
        for kind, names in kinds.items():
            print(f"{kind:<16}{len(names)}")
        print(f"size      {total / 1e6:.2f} MB in {len(sizes)} files")
        from .backends.cache_limit import limit_bytes
        limit = limit_bytes()
        print(f"limit     {limit / 1e6:.0f} MB of C libraries, least recently used removed "
              "past it (EINFUSE_CACHE_MAX_MB)" if limit else
              "limit     none (EINFUSE_CACHE_MAX_MB <= 0)")
        return 0
    removed = 0
    for entry in entries:
        path = os.path.join(where, entry)
        try:
            if os.path.isfile(path):
                os.remove(path)
                removed += 1
            elif entry.startswith(".build-"):
                import shutil
                shutil.rmtree(path, ignore_errors=True)
        except OSError as error:
            print(f"einfuse: could not remove {path}: {error}", file=sys.stderr)
            return 1
    print(f"removed {removed} files ({total / 1e6:.2f} MB) from {where}")
    return 0


def _calibrate(show: bool) -> int:
    """``einfuse calibrate``: measure (again) and cache; ``--show``: the cached figures."""
    from .pictures import cached, calibrate
    found = cached() if show else None
    print((found or calibrate()).describe())
    return 0


def _explain(args) -> int:
    from .api import explain
    shapes: Dict[str, Tuple[int, ...]] = dict(args.shape)
    ranges = dict(args.range) or None
    params = dict(args.param)
    try:
        text = explain(args.statement, shapes=shapes or None, ranges=ranges, pad=args.pad,
                       bounds=args.bounds, fill=args.fill, dtype=args.dtype,
                       backend=args.backend, gradients=args.gradients,
                       source=args.source, measure=args.measure,
                       **_parameters(params, bool(shapes)))
    except EinfuseError as error:
        shown = type(error)(cli_words(error.message), source=error.source, span=error.span)
        print(f"einfuse: {type(error).__name__}: {shown}", file=sys.stderr)
        return 1
    print("\n".join(cli_words(line) if line.startswith("Note: ") else line
                    for line in str(text).split("\n")))
    if args.html:
        try:
            text.save(args.html)
        except EinfuseError as error:
            print(f"einfuse: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def _parameters(params: Dict[str, float], shapes: bool) -> Dict[str, object]:
    """The keyword arguments that pass --param values to explain().  A parameter named
    like one of explain()'s keywords (pad, bounds ...) goes in arrays=; with --shape,
    explain() values every parameter itself (placeholders), so such a name is left to it
    rather than given twice."""
    import inspect
    from .api import explain
    keywords = set(inspect.signature(explain).parameters)
    plain = {name: value for name, value in params.items() if name not in keywords}
    clashing = {name: value for name, value in params.items() if name in keywords}
    if clashing and not shapes:
        plain["arrays"] = clashing
    return plain


# The library's messages name Python keywords (ranges=, pad= ...); on the command line
# the same advice names the flags.  Most specific patterns first.
_CLI_WORDS = (
    (r"pass arrays or shapes=", "pass --shape NAME=AxB"),
    (r"the (tensor|output) (\w+) was not passed; pass \2=\.\.\.",
     r"the \1 \2 was not passed; give its shape with --shape \2=AxB"),
    (r"the scalar parameter (\w+) was not passed; pass \1=\.\.\.",
     r"the scalar parameter \1 was not passed; give it with --param \1=X"),
    (r"(\w+)= is not used by the statement",
     r"\1 (given by --shape or --param) is not used by the statement"),
    (r"ranges=\{[^}]*\}", lambda found: _range_flags(found.group(0))),
    (r"bounds='clip', 'wrap' or 'fill'", "--bounds clip, wrap or fill"),
    (r"\b(bounds|dtype|backend)='([^']*)'", r"--\1 \2"),
    (r"\branges=", "--range"),
    (r"\bshapes=", "--shape"),
    (r"\b(pad|fill|bounds|dtype|backend)=", r"--\1"),
)


def _range_flags(hint: str) -> str:
    """``ranges={'p': 3, 'q': range(1, 5)}`` as ``--range p=3 --range q=1:5``: one flag
    per key (a number stays, a range(a, b) is a:b, anything else is N)."""
    flags = []
    for name, value in re.findall(r"'(\w+)': (range\([^)]*\)|[^,}]+)", hint):
        bounds = re.fullmatch(r"range\((-?\d+), (-?\d+)\)", value.strip())
        if bounds:
            shown = f"{bounds.group(1)}:{bounds.group(2)}"
        else:
            shown = value.strip() if value.strip().isdigit() else "N"
        flags.append(f"--range {name}={shown}")
    return " ".join(flags) or "--range"


def cli_words(message: str) -> str:
    """``message`` with each Python keyword replaced by its command-line flag."""
    for pattern, replacement in _CLI_WORDS:
        message = re.sub(pattern, replacement, message)
    return message


def _bench(args) -> int:
    import os
    import platform
    import importlib.util
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        # said before anything runs, not after minutes of timing
        print("einfuse: bench --plot draws with matplotlib, which is not installed: "
              "pip install matplotlib (or einfuse[bench])", file=sys.stderr)
        return 1
    if args.html and not os.access(os.path.dirname(os.path.abspath(args.html)), os.W_OK):
        print(f"einfuse: bench --html {args.html}: its directory does not exist or is not "
              "writable", file=sys.stderr)     # said before minutes of timing, as --plot
        return 1
    if args.device == "cuda":
        return _bench_gpu(args)
    # No OMP_WAIT_POLICY here: einfuse's kernels load libgomp with a passive wait
    # policy themselves (backends/c/build.py), as for every library user.
    from .bench import all_cases, run_case, text_table
    everything = all_cases(args.quick)
    cases = _selected(everything, args.case, everything)
    results = _run_cases(cases, lambda case: run_case(
        case, backend=args.backend, peers=args.peer, budget_s=args.budget))
    if results is None:
        return 1
    print(text_table(results))
    machine = (f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
               f"{platform.python_version()}; medians of repeated runs after one warm-up "
               "call; 'peer / einfuse' above 1 means einfuse is faster.")
    _write_results(args, "bench", f"# einfuse bench\n\n{machine}\n", results)
    return _write_html(args, results, machine)


def _write_html(args, results, machine: str) -> int:
    """With --html FILE: the results as a page (bench_page: charts and the table)."""
    if not args.html:
        return 0
    from .bench.report import rows
    from .pictures import bench_page, cpu_model, save_page
    try:
        save_page(bench_page(results, rows(results), f"{cpu_model()}; {machine}"),
                  args.html)
    except EinfuseError as error:
        print(f"einfuse: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.html}", file=sys.stderr)
    return 0


def _selected(cases, names, everything=None):
    """The cases whose names start with one of ``names`` (all when none is given); when
    none matches, the message lists the cases there are."""
    chosen = [c for c in cases if not names or any(c.name.startswith(n) for n in names)]
    if not chosen and everything:
        print("einfuse: the cases are: " + "; ".join(c.name for c in everything),
              file=sys.stderr)
    return chosen


def _run_cases(cases, run_one):
    """Every case's measurements in order, with progress on stderr; None (after saying
    so) when --case matched nothing."""
    if not cases:
        print("einfuse: no benchmark case matches --case", file=sys.stderr)
        return None
    results = []
    for index, case in enumerate(cases, 1):
        print(f"({index}/{len(cases)}) {case.name}: {case.statement}", file=sys.stderr)
        results += run_one(case)
    return results


def _write_results(args, stem: str, header: str, results, footer: str = "") -> None:
    """With --out: DIR/STEM.md (and DIR/STEM.png with --plot)."""
    import os
    from .bench import bar_chart, markdown_table
    if not args.out:
        return
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{stem}.md"), "w") as handle:
        handle.write(markdown_table(results, header) + footer)
    if args.plot:
        bar_chart(results, os.path.join(args.out, f"{stem}.png"), f"einfuse {stem}")
    print(f"wrote {args.out}/{stem}.md" + (f" and {stem}.png" if args.plot else ""),
          file=sys.stderr)


def _bench_gpu(args) -> int:
    """``--device cuda``: the GPU cases, each call synchronised; refuses (exit 1) where
    no CUDA GPU is usable rather than timing something else."""
    from .bench import catalogue, gpu, text_table
    problem = gpu.cuda_problem()
    if problem:
        print(f"einfuse: bench --device cuda: {problem}", file=sys.stderr)
        return 1
    everything = catalogue.gpu_cases("cuda", args.quick)
    cases = _selected(everything, args.case, everything)
    results = _run_cases(cases, lambda case: gpu.run_gpu_case(
        case, "cuda", args.backend, args.peer, args.budget))
    if results is None:
        return 1
    targets = gpu.target_lines(cases, results)
    print(text_table(results))
    if targets:
        print("\ntargets:\n" + "\n".join(f"  {line}" for line in targets))
    header = (f"# einfuse bench --device cuda{' --quick' if args.quick else ''}\n\n"
              f"machine: {gpu.machine_line()}; einfuse backend {args.backend}; medians "
              "of repeated runs after one warm-up call (it compiles and autotunes), every "
              "call synchronised; 'peer / einfuse' above 1 means einfuse is faster.\n")
    footer = "\n## Targets\n\n" + "".join(f"- {line}\n" for line in targets) \
        if targets else ""
    _write_results(args, "gpu", header, results, footer)
    return _write_html(args, results, f"{gpu.machine_line()}; einfuse backend {args.backend}")


if __name__ == "__main__":
    sys.exit(main())
