"""Render the loop-nest IR as readable pseudo-code, for ``explain``: the loops, tiles,
register accumulators and SIMD lanes that the compiled kernel really runs, with the
statement's own index and tensor names and, when known, the call's sizes.

A sibling of the C renderer: one method per IR node type."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence

from .. import ir
from ..ir import LoopKind, Policy, ReduceOp
from ..lang.printer import format_number

_INIT = {ReduceOp.SUM: "0", ReduceOp.PROD: "1", ReduceOp.MAX: "-inf", ReduceOp.MIN: "+inf",
         ReduceOp.LOGSUMEXP: "-inf", ReduceOp.ARGMAX: "position 0 of -inf",
         ReduceOp.ARGMIN: "position 0 of +inf"}


class LoopLine(str):
    """A loop's line of the pseudo-code: the text as shown, and as data what the loop is
    (for the pictures, docs/pictures.md): ``kind`` 'threads' (the loop split across
    threads), 'vector' (SIMD lanes), 'blocked' (steps of ``tile``), or the IR's loop kind
    ('parallel', 'serial', 'reduction'); ``depth`` its nesting."""

    def __new__(cls, text: str, kind: str, depth: int, tile: Optional[int] = None,
                threads: bool = False):
        line = super().__new__(cls, text)
        line.kind, line.depth, line.tile, line.threads = kind, depth, tile, threads
        return line


class PseudoRenderer:
    def __init__(self, program: ir.LoopProgram, tensors: Sequence[str], indices: Sequence[str],
                 params: Sequence[str], values: Optional[Mapping[str, int]] = None):
        self.program = program
        self.tensors = list(tensors)          # tensor name per buffer slot
        self.params = list(params)
        self.values = dict(values or {})      # runtime int name -> value, when known
        self.names: Dict[str, str] = {}
        for k, index in enumerate(indices):
            self.names.update({f"p{k}": index, f"b{k}": f"{index}0", f"r{k}": f"{index}0",
                               f"n{k}": f"n_{index}", f"lo{k}": f"lo_{index}"})
        self.names.update({"l": "lane", "nb": "lanes", "r": "row", "nr": "rows"})
        # the statement's own names: a generated local (accumulator a0, its error e0)
        # spelled like one is shown primed (a statement may name its indices a0, a1)
        self.visible = set(self.tensors) | set(self.params) | set(indices) | \
            set(self.names.values())
        self.in_parallel = False   # as in C, only the outermost parallel loop is threaded

    def name(self, generated: str) -> str:
        if generated.startswith("la"):
            return "lane"
        if generated.startswith("ca"):
            return "lanes"
        shown = self.names.get(generated)
        if shown is not None:
            return shown
        return generated + "'" if generated in self.visible else generated

    def render(self) -> List[str]:
        lines: List[str] = []
        for kernel in self.program.kernels:
            for stmt in kernel.body:
                lines += self.stmt(stmt, 0)
        return lines

    # -- integers --------------------------------------------------------------------------
    def affine(self, a: ir.Affine, drop_zero_starts: bool = True) -> str:
        const = a.const
        parts = []
        for term, coeff in a.terms:
            if term in self.values and (term.startswith("lo") or term.startswith("n")):
                const += coeff * self.values[term]
                continue
            shown = self.name(term)
            parts.append(shown if coeff == 1 else f"-{shown}" if coeff == -1
                         else f"{coeff}*{shown}")
        if const or not parts:
            parts.append(str(const))
        text = parts[0]
        for part in parts[1:]:
            text += f" - {part[1:]}" if part.startswith("-") else f" + {part}"
        return text

    def last(self, extent: ir.Affine) -> str:
        return self.affine(extent + ir.Affine(const=-1))

    # -- statements -------------------------------------------------------------------------
    def stmt(self, node: ir.Stmt, depth: int) -> List[str]:
        return getattr(self, "stmt_" + type(node).__name__)(node, depth)

    def block(self, body, depth: int) -> List[str]:
        return [line for stmt in body for line in self.stmt(stmt, depth)]

    def threads(self, kind: str) -> bool:
        """Whether this loop is the one split across threads (and mark it so)."""
        if kind == LoopKind.PARALLEL and not self.in_parallel:
            self.in_parallel = True
            return True
        return False

    def stmt_Loop(self, node: ir.Loop, depth: int) -> List[str]:
        threaded = self.threads(node.kind)
        notes = [n for n, on in (("threads (OpenMP)", threaded),
                                 ("SIMD lanes", node.kind == LoopKind.VECTORISED),
                                 ("SIMD", node.simd and node.kind != LoopKind.VECTORISED)) if on]
        first = "0" if node.start is None else self.affine(node.start)
        head = f"for {self.name(node.var)} in {first}..{self.last(node.extent)}:"
        kind = "threads" if threaded else "vector" if node.kind == LoopKind.VECTORISED or \
            node.simd else str(node.kind.value)
        lines = [LoopLine("  " * depth + head + (f"   # {', '.join(notes)}" if notes else ""),
                          kind, depth, threads=threaded)]
        lines += self.block(node.body, depth + 1)
        self.in_parallel = self.in_parallel and not threaded
        return lines

    def stmt_TiledLoop(self, node: ir.TiledLoop, depth: int) -> List[str]:
        threaded = self.threads(node.kind)
        note = "threads (OpenMP), " if threaded else ""
        first = "0" if node.start is None else self.affine(node.start)
        head = (f"for {self.name(node.var)} in {first}..{self.last(node.extent)} "
                f"step {node.tile}:"
                f"   # {note}{self.name(node.count)} = min({node.tile}, rest)")
        lines = [LoopLine("  " * depth + head, "blocked", depth, node.tile, threaded)] + \
            self.block(node.body, depth + 1)
        self.in_parallel = self.in_parallel and not threaded
        return lines

    def stmt_DeclareAcc(self, node: ir.DeclareAcc, depth: int) -> List[str]:
        shape = "".join(f"[{n}]" for n in (node.rows, node.lanes) if n)
        where = "   # registers" if shape else ""
        return ["  " * depth + f"{self.name(node.name)}{shape} = {_INIT[node.op]}{where}"]

    def stmt_Accumulate(self, node: ir.Accumulate, depth: int) -> List[str]:
        ref = self.acc(node.name, node.lane, node.row)
        value = self.expr(node.value)
        text = {ReduceOp.SUM: f"{ref} += {value}", ReduceOp.PROD: f"{ref} *= {value}",
                ReduceOp.MAX: f"{ref} = max({ref}, {value})",
                ReduceOp.MIN: f"{ref} = min({ref}, {value})",
                ReduceOp.LOGSUMEXP: f"{ref} = logaddexp({ref}, {value})   # running max",
                ReduceOp.ARGMAX: f"{ref} = position of the first maximum so far ({value})",
                ReduceOp.ARGMIN: f"{ref} = position of the first minimum so far ({value})"
                }[node.op]
        return ["  " * depth + text]

    def stmt_CombineLanes(self, node: ir.CombineLanes, depth: int) -> List[str]:
        if node.errors is not None:
            return ["  " * depth + f"{self.name(node.into)} += sum of {self.name(node.name)}"
                    f"[0..{node.lanes - 1}]   # pairwise, errors into "
                    f"{self.name(node.errors[1])}"]
        return ["  " * depth + f"{self.name(node.into)} = {node.op} of "
                f"{self.name(node.name)}[0..{node.lanes - 1}]"]

    def stmt_Fold(self, node: ir.Fold, depth: int) -> List[str]:
        shape = "".join(f"[{n}]" for n in (node.rows, node.lanes) if n)
        return ["  " * depth + f"{self.name(node.into)}{shape} += "
                f"{self.name(node.source)}{shape}   # compensated: rounding errors into "
                f"{self.name(node.error)}"]

    def stmt_Compensate(self, node: ir.Compensate, depth: int) -> List[str]:
        shape = "".join(f"[{n}]" for n in (node.rows, node.lanes) if n)
        return ["  " * depth + f"{self.name(node.acc)}{shape} += {self.name(node.error)}{shape}"]

    def stmt_Branch(self, node: ir.Branch, depth: int) -> List[str]:
        """The branch this call takes when its sizes are known, else both."""
        terms = [self.affine(e) for e in node.extents]
        if all(t.lstrip("-").isdigit() for t in terms):
            total = 1
            for t in terms:
                total *= int(t)
            short = total <= node.limit
            note = (f"# {total} terms: " + ("one accumulator" if short else
                    "blocks of partial sums, each added with compensation"))
            return ["  " * depth + note] + self.block(node.small if short else node.large,
                                                       depth)
        return (["  " * depth + f"if {' * '.join(terms)} <= {node.limit}:"] +
                self.block(node.small, depth + 1) +
                ["  " * depth + "else:   # blocks of partial sums, added with compensation"] +
                self.block(node.large, depth + 1))

    def stmt_Let(self, node: ir.Let, depth: int) -> List[str]:
        return ["  " * depth + f"{self.name(node.name)} = {self.expr(node.value)}"]

    def stmt_NormalBranch(self, node: ir.NormalBranch, depth: int) -> List[str]:
        names = ", ".join(self.name(n) for n in node.names)
        return (["  " * depth + f"# products by {names}; where one is 0, subnormal, "
                 "inf or NaN, the same loop dividing"] + self.block(node.then, depth))

    def stmt_Store(self, node: ir.Store, depth: int) -> List[str]:
        target = f"{self.tensors[node.buffer]}[{', '.join(self.affine(p) for p in node.position)}]"
        return ["  " * depth + f"{target} = {self.expr(node.value)}"]

    def acc(self, name: str, lane: Optional[str], row: Optional[str]) -> str:
        return self.name(name) + (f"[{self.name(row)}]" if row else "") + \
            (f"[{self.name(lane)}]" if lane else "")

    # -- expressions ------------------------------------------------------------------------
    def expr(self, node: ir.Expr) -> str:
        return getattr(self, "expr_" + type(node).__name__)(node)

    def expr_Const(self, node: ir.Const) -> str:
        return format_number(node.value)

    def expr_Param(self, node: ir.Param) -> str:
        return self.params[node.slot]

    def expr_IndexValue(self, node: ir.IndexValue) -> str:
        return f"({self.affine(node.value)})"

    def expr_Load(self, node: ir.Load) -> str:
        subs = []
        for sub in node.subscripts:
            text = self.affine(sub.affine)
            for part, coeff in sub.quasi:
                inner = self.affine(part.affine)
                inner = inner if inner.isidentifier() else f"({inner})"
                q = f"{inner} {part.op} {part.divisor}"
                q = q if coeff == 1 else f"{coeff}*({q})"
                text = q if text == "0" else f"{text} + {q}"
            for gathered, coeff in sub.gathers:
                g = self.expr(gathered)
                g = g if coeff == 1 else f"{coeff}*{g}"
                text = g if text == "0" else f"{g} + {text}"
            if sub.policy != Policy.NONE:
                text += f" ({sub.policy})"
            subs.append(text)
        return f"{self.tensors[node.buffer]}[{', '.join(subs)}]"

    def expr_Unary(self, node: ir.Unary) -> str:
        return f"-({self.expr(node.operand)})"

    def expr_Binary(self, node: ir.Binary) -> str:
        return f"({self.expr(node.left)} {node.op} {self.expr(node.right)})"

    def expr_Call(self, node: ir.Call) -> str:
        return f"{node.func}({', '.join(self.expr(a) for a in node.args)})"

    def expr_Local(self, node: ir.Local) -> str:
        return self.name(node.name)

    def expr_AccValue(self, node: ir.AccValue) -> str:
        return self.acc(node.acc, node.lane, node.row)


def render_pseudo(program: ir.LoopProgram, tensors: Sequence[str], indices: Sequence[str],
                  params: Sequence[str], values: Optional[Mapping[str, int]] = None
                  ) -> List[str]:
    return PseudoRenderer(program, tensors, indices, params, values).render()
