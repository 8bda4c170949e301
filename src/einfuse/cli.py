"""The ``einfuse`` command: ``einfuse explain "STATEMENT" --shape A=100x50 ...``."""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Sequence, Tuple

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
    sub = parser.add_subparsers(dest="command", required=True)
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
    explain.add_argument("--dtype", default=None)
    explain.add_argument("--backend", default="auto")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "explain":
        return _explain(args)
    return 2  # argparse rejects unknown commands before this


def _explain(args) -> int:
    from .explain import explain
    shapes: Dict[str, Tuple[int, ...]] = dict(args.shape)
    ranges = dict(args.range) or None
    params = dict(args.param)
    try:
        text = explain(args.statement, shapes=shapes or None, ranges=ranges, pad=args.pad,
                       bounds=args.bounds, dtype=args.dtype, backend=args.backend,
                       **params)
    except EinfuseError as error:
        print(f"einfuse: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
