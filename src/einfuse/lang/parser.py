"""Recursive-descent parser for one einfuse statement, with Python's precedence.

    statement  := lhs (':=' | '=' | '+=') expr
    lhs        := NAME [ '[' [NAME (',' NAME)*] ']' ]
    expr       := bitor (cmp_op bitor)*          comparisons chain as in Python
    bitor      := bitand ('|' bitand)*
    bitand     := arith ('&' arith)*
    arith      := term (('+'|'-') term)*
    term       := unary (('*'|'/'|'//'|'%') unary)*   '//' floors, '%' is Python's modulo
    unary      := ('-'|'+') unary | power
    power      := atom ['**' unary]              right-associative
    atom       := NUMBER | NAME | NAME '[' subs ']' | FUNC '(' args ')'
                | RED '[' NAME (',' NAME)* ']' '(' expr ')' | '(' expr ')'

Bare names are resolved after parsing: a name that is an index anywhere in the
statement (left side, inside brackets, or bound by a reduction) is an
:class:`IndexValue`, any other bare name is a scalar :class:`Param`.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections import Counter
from typing import Dict, List, Optional, Set, Tuple

from ..errors import EinfuseNameError, EinfuseOverflowError, EinfuseSyntaxError
from .ast import (ASSIGN_OPS, BINARY_FUNCTIONS, COMPARISON_OPS, CONSTANTS, FUNCTIONS,
                  POSITION_REDUCTIONS, REDUCTIONS, RESERVED, TERNARY_FUNCTIONS,
                  UNARY_FUNCTIONS, Access, Binary, Call, Expr, IndexExpr, IndexValue, Number,
                  Param, Reduce, Statement, Unary, map_children)
from .lexer import END, NAME, NUMBER, OP, Token, tokenize
from .rewrite import names_in
from .subscripts import SubscriptBuilder
from .sugar import SUGAR_REDUCTIONS, FreshNames, expand


# Every integer the notation computes with (literals, subscript coefficients and
# offsets, index values) is an int64 on every backend, so each must fit one.
INT64_MAX = 2**63 - 1
# Reductions users reach for that the notation does not have (yet).
PLANNED_REDUCTIONS = ("any", "all", "std", "median", "count")
_REDUCTION_LIST = "sum, prod, max, min, logsumexp, mean, var, argmax and argmin"
# An einsum subscript string: letters (or '...') per operand, commas, an optional '->'.
_EINSUM = re.compile(r"\s*([A-Za-z.]*(?:\s*,\s*[A-Za-z.]*)*)\s*(?:->\s*([A-Za-z.]*))?\s*\Z")


def parse(source: str) -> Statement:
    """Parse ``source`` into a :class:`Statement` (names resolved)."""
    if not isinstance(source, str):
        raise EinfuseSyntaxError(f"a statement must be a string, not {type(source).__name__}")
    hint = einsum_hint(source) or einops_hint(source)
    if hint:
        raise EinfuseSyntaxError(hint, source=source, span=(0, len(source)))
    try:
        return _Parser(source).statement()
    except RecursionError:
        raise EinfuseSyntaxError("the statement nests too deeply to parse", source=source,
                                 span=(0, len(source))) from None


def einsum_hint(source: str) -> Optional[str]:
    """For an einsum string (``"ik,kj->ij"``), a message with the equivalent statement."""
    match = _EINSUM.match(source)
    if not match or not ("->" in source or "," in source):
        return None
    operands = [op.strip() for op in match.group(1).split(",")]
    output = match.group(2)
    text = source.strip()
    if "." in "".join(operands) + (output or ""):
        return (f"{text!r} is einsum syntax; call ef.einsum({text!r}, ...) with the "
                "operands, or name every axis in einfuse notation (it has no '...'), as in "
                "out[b, i, j] := A[b, i, k] * B[b, k, j]")
    if output is None:  # einsum's implicit output: the letters used once, sorted
        counts = Counter("".join(operands))
        output = "".join(sorted(c for c, n in counts.items() if n == 1))
    letters = set("".join(operands) + output)
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in letters]
    names = free[:len(operands)] if len(free) >= len(operands) else \
        [f"T{n}" for n in range(len(operands))]
    rhs = " * ".join(f"{name}[{', '.join(op)}]" for name, op in zip(names, operands))
    lhs = f"out[{', '.join(output)}]" if output else "out"
    return (f"{text!r} is einsum syntax; call ef.einsum({text!r}, {', '.join(names)}), or in "
            f"einfuse notation it is {lhs} := {rhs} (passing the operands as "
            f"{', '.join(n + '=' for n in names)})")


# An einops pattern: names, numbers, '...' and parentheses on each side of one '->'.
# One character per step (a name is not matched as a whole), so that a long text that
# is no pattern fails in linear time: a name-sized alternative under '*' backtracked
# over every way of splitting a long name (exponential).
_EINOPS_SIDE = re.compile(r"(?:[\sA-Za-z_0-9()]|\.\.\.)*")


def einops_hint(source: str) -> Optional[str]:
    """For an einops pattern (``"b h w c -> b c"``), a message naming the calls to use."""
    sides = source.split("->")
    if len(sides) != 2 or not all(_EINOPS_SIDE.fullmatch(side) for side in sides):
        return None
    text = source.strip()
    return (f"{text!r} is einops syntax; call ef.rearrange(x, {text!r}), "
            f"ef.reduce(x, {text!r}, 'sum') or ef.repeat(x, {text!r}, ...) with the "
            "array (and the sizes of new or split axes as keywords), or write it in einfuse "
            "notation with every index named, as in y[b, c] := sum[h, w](x[b, h, w, c])")


def _bracket_pairs(tokens: List[Token]):
    """Each matched '[' or '(' token's position -> its closing token's position, and the
    positions of the openers that are never closed."""
    pairs: Dict[int, int] = {}
    unclosed: Set[int] = set()
    stack: List[int] = []
    for n, token in enumerate(tokens):
        if token.kind != OP:
            continue
        if token.text in ("[", "("):
            stack.append(n)
        elif token.text in ("]", ")"):
            want = "[" if token.text == "]" else "("
            while stack and tokens[stack[-1]].text != want:
                unclosed.add(stack.pop())
            if stack:
                pairs[stack.pop()] = n
    return pairs, unclosed | set(stack)


def _suggest(name: str, choices) -> str:
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


def _arity(func: str) -> Tuple[int, ...]:
    arities = []
    if func in UNARY_FUNCTIONS:
        arities.append(1)
    if func in BINARY_FUNCTIONS:
        arities.append(2)
    if func in TERNARY_FUNCTIONS:
        arities.append(3)
    return tuple(arities)


class _Parser:
    def __init__(self, source: str):
        self.source = source
        self.tokens = tokenize(source)
        self.pos = 0
        self.pairs, self.unclosed = _bracket_pairs(self.tokens)

    # -- token helpers -------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def at(self, text: str) -> bool:
        return self.tok.kind == OP and self.tok.text == text

    def advance(self) -> Token:
        token = self.tok
        self.pos += 1
        return token

    def expect(self, text: str, what: str) -> Token:
        if not self.at(text):
            self.fail(f"expected {text!r} {what}")
        return self.advance()

    def fail(self, message: str, token: Optional[Token] = None):
        token = token or self.tok
        found = "end of statement" if token.kind == END else repr(token.text)
        raise EinfuseSyntaxError(f"{message}, found {found}", source=self.source,
                                 span=(token.start, token.end))

    def error(self, message: str, start: int, end: int, cls=EinfuseSyntaxError):
        raise cls(message, source=self.source, span=(start, end))

    # -- statement -------------------------------------------------------------------
    def statement(self) -> Statement:
        if self.tok.kind != NAME:
            self.fail("a statement starts with the output's name")
        out_tok = self.advance()
        self.check_name_free(out_tok, "output")
        indices: List[str] = []
        index_spans = []
        if self.at("["):
            self.advance()
            while not self.at("]"):
                if self.tok.kind != NAME:
                    self.fail("the left side takes plain index names only")
                name_tok = self.advance()
                if self.at("["):
                    self.scatter_on_left(out_tok, name_tok)
                self.check_name_free(name_tok, "index")
                if name_tok.text in indices:
                    self.error(f"index {name_tok.text} is repeated on the left side; "
                               "each output axis needs its own index", name_tok.start,
                               name_tok.end, cls=_index_rule_error())
                indices.append(name_tok.text)
                index_spans.append((name_tok.start, name_tok.end))
                if not self.at(","):
                    break
                self.advance()
            self.expect("]", "to close the output's indices")
        if not (self.tok.kind == OP and self.tok.text in ASSIGN_OPS):
            self.fail("expected ':=', '=' or '+=' after the output")
        assign = self.advance().text
        rhs = self.expr()
        if self.tok.kind != END:
            self.fail("unexpected text after the expression")
        statement = Statement(out_tok.text, tuple(indices), assign, rhs, source=self.source,
                              output_span=(out_tok.start, out_tok.end),
                              index_spans=tuple(index_spans))
        return _Resolver(statement).resolve()

    def scatter_on_left(self, out_tok: Token, name_tok: Token):
        """A gather in an output subscript, ``S[seg[n], d] += v[n, d]``: a scatter (each
        value sent to the position it names), which the notation does not have.  The
        error writes the statement as a one-hot sum, which it does have, and names
        ef.jit's scatter-add.  The left side is re-read as expressions to write it."""
        self.pos = next(k for k, t in enumerate(self.tokens) if t.start > out_tok.start)
        self.advance()                               # the output's '['
        subscripts: List[Tuple[int, int]] = []
        alternative = None
        try:
            while True:
                start = self.tok.start
                self.bitor()
                subscripts.append((start, self.prev_end()))
                if not self.at(","):
                    break
                self.advance()
            self.expect("]", "to close the output's indices")
            if not (self.tok.kind == OP and self.tok.text in ASSIGN_OPS):
                self.fail("expected ':=', '=' or '+='")
            assign = self.advance().text
            start = self.tok.start
            rhs = self.expr()
            if self.tok.kind == END:
                alternative = self.one_hot(out_tok.text, subscripts, assign,
                                           (start, self.prev_end()), rhs)
        except EinfuseSyntaxError:
            pass      # the rest does not parse either: the scatter is said alone
        scattered = next((span for span in subscripts
                          if not self.source[span[0]:span[1]].strip().isidentifier()),
                         (name_tok.start, name_tok.end))
        text = self.source[scattered[0]:scattered[1]]
        if scattered == (name_tok.start, name_tok.end):
            text += "[...]"
        written = (f"as a one-hot sum, {alternative}, or " if alternative else
                   "as a one-hot sum over a new index s, such as `S[s, d] += (seg[n] == s) "
                   "* v[n, d]`, or ")
        self.error(f"the left side takes plain index names only: {text} there would scatter "
                   f"(send each value to the position {text} names), which the notation "
                   f"does not have; write it {written}compute it in a JAX function under "
                   "ef.jit with jax.ops.segment_sum or x.at[index].add(values)",
                   scattered[0], scattered[1])

    def one_hot(self, output: str, subscripts, assign: str, rhs_span, rhs: Expr) -> str:
        """The statement a scatter on the left means: each scattered subscript a new
        index compared with it on the right (its other indices summed)."""
        used = {t.text for t in self.tokens if t.kind == NAME}
        fresh = (name for name in ("s", "g", "t", "u", *(f"s{k}" for k in range(1, 99)))
                 if name not in used)
        indices, conditions, ranges = [], [], []
        for start, end in subscripts:
            text = self.source[start:end].strip()
            if text.isidentifier():
                indices.append(text)
                continue
            name = next(fresh)
            indices.append(name)
            conditions.append(f"({text} == {name})")
            ranges.append(name)
        body = self.source[rhs_span[0]:rhs_span[1]].strip()
        if isinstance(rhs, Binary):    # (a product binds tighter than + or a comparison)
            body = f"({body})"
        statement = f"`{output}[{', '.join(indices)}] {assign} {' * '.join(conditions)} * " \
            f"{body}`"
        if assign == ":=":   # nothing else gives the new indices their ranges
            statement += f" with ranges={{{', '.join(f'{n!r}: ...' for n in ranges)}}}"
        return statement

    def check_name_free(self, token: Token, role: str):
        if token.text in RESERVED:
            self.error(f"{token.text!r} is a reserved name (a function, reduction or "
                       f"constant) and cannot be an {role}", token.start, token.end,
                       cls=EinfuseNameError)

    # -- expressions -------------------------------------------------------------------
    def expr(self) -> Expr:
        start = self.tok.start
        left = self.bitor()
        result: Optional[Expr] = None
        while self.tok.kind == OP and self.tok.text in COMPARISON_OPS:
            op = self.advance().text
            right = self.bitor()
            comparison = Binary(op, left, right, span=(start, self.prev_end()))
            result = comparison if result is None else \
                Binary("&", result, comparison, span=(start, self.prev_end()))
            left = right
        return left if result is None else result

    def prev_end(self) -> int:
        return self.tokens[self.pos - 1].end

    def binary_level(self, ops: Tuple[str, ...], operand) -> Expr:
        start = self.tok.start
        left = operand()
        while self.tok.kind == OP and self.tok.text in ops:
            op = self.advance().text
            right = operand()
            left = Binary(op, left, right, span=(start, self.prev_end()))
        return left

    def bitor(self) -> Expr:
        return self.binary_level(("|",), self.bitand)

    def bitand(self) -> Expr:
        return self.binary_level(("&",), self.arith)

    def arith(self) -> Expr:
        return self.binary_level(("+", "-"), self.term)

    def term(self) -> Expr:
        return self.binary_level(("*", "/", "//", "%"), self.unary)

    def unary(self) -> Expr:
        if self.at("-") or self.at("+"):
            op_tok = self.advance()
            operand = self.unary()
            if op_tok.text == "+":
                return operand
            if isinstance(operand, Number):  # fold so that -1 is a literal
                return Number(-operand.value, span=(op_tok.start, self.prev_end()))
            return Unary("-", operand, span=(op_tok.start, self.prev_end()))
        return self.power()

    def power(self) -> Expr:
        start = self.tok.start
        base = self.atom()
        if self.at("**"):
            self.advance()
            exponent = self.unary()
            return Binary("**", base, exponent, span=(start, self.prev_end()))
        return base

    def atom(self) -> Expr:
        token = self.tok
        if token.kind == NUMBER:
            self.advance()
            text = token.text
            if text.isdigit():
                return Number(self.int_literal(token), span=(token.start, token.end))
            return Number(float(text), span=(token.start, token.end))
        if self.at("("):
            self.advance()
            inner = self.expr()
            self.expect(")", "to close '('")
            return inner
        if token.kind != NAME:
            self.fail("expected a number, a name or '('")
        name = token.text
        nxt = self.peek()
        unreserved = SUGAR_REDUCTIONS + POSITION_REDUCTIONS
        if nxt.kind == OP and nxt.text == "[" and name not in REDUCTIONS \
                and name not in unreserved:
            close = self.pairs.get(self.pos + 1)
            after = self.tokens[close + 1] if close is not None else None
            if after is not None and after.kind == OP and after.text == "(":
                self.not_a_reduction(token, self.tokens[close])
        if name in REDUCTIONS and nxt.kind == OP and nxt.text == "[":
            return self.reduction()
        if name in unreserved and self.reduction_follows():
            return self.reduction()    # not reserved: mean[i] alone is still a tensor
        if name in CONSTANTS and not (nxt.kind == OP and nxt.text in "[("):
            self.advance()
            return Number(CONSTANTS[name], span=(token.start, token.end))
        if name in CONSTANTS:
            self.error(f"{name!r} is a reserved constant and cannot be indexed or called",
                       token.start, token.end, cls=EinfuseNameError)
        if nxt.kind == OP and nxt.text == "(":
            return self.call()
        if name in RESERVED:
            hint = f"; write {name}[k](...)" if name in REDUCTIONS else ""
            self.error(f"{name!r} is a reserved name and needs its arguments{hint}",
                       token.start, token.end, cls=EinfuseNameError)
        self.advance()
        if self.at("["):
            return self.access(token)
        return Param(name, span=(token.start, token.end))

    def reduction_follows(self) -> bool:
        """Whether the name here starts ``name[...](``, the form of a reduction."""
        nxt = self.peek()
        if not (nxt.kind == OP and nxt.text == "["):
            return False
        close = self.pairs.get(self.pos + 1)
        after = self.tokens[close + 1] if close is not None else None
        return after is not None and after.kind == OP and after.text == "("

    def int_literal(self, token: Token) -> int:
        digits = token.text.lstrip("0") or "0"
        # the length test comes first: int() refuses strings of over 4300 digits
        if len(digits) > len(str(INT64_MAX)) or int(digits) > INT64_MAX:
            shown = token.text if len(token.text) <= 30 else token.text[:24] + "..."
            self.error(f"the integer literal {shown} does not fit in int64 (at most "
                       f"{INT64_MAX} in magnitude); outside subscripts a float literal "
                       "such as 1e20 holds a large value", token.start, token.end,
                       cls=EinfuseOverflowError)
        return int(digits)

    def not_a_reduction(self, token: Token, close: Token):
        name = token.text
        written = self.source[token.start:close.end] + "(...)"   # as in mean[j](...)
        if name in PLANNED_REDUCTIONS:
            message = f"{written} is not part of the notation yet; the reductions are " \
                      f"{_REDUCTION_LIST}"
        elif _suggest(name, REDUCTIONS):
            message = f"{written} reads like a reduction, but {name!r} is not one" \
                      f"{_suggest(name, REDUCTIONS)}; the reductions are {_REDUCTION_LIST}"
        else:   # a tensor followed by '(': a reduction meant, or a product without '*'
            self.error(f"'(' cannot follow {self.source[token.start:close.end]}: the "
                       f"reductions are {_REDUCTION_LIST} (as in sum[j](...)), and a "
                       "product needs '*'", token.start, close.end)
        self.error(message, token.start, close.end, cls=EinfuseNameError)

    def reduction(self) -> Expr:
        op_tok = self.advance()
        self.expect("[", "after the reduction's name")
        names: List[str] = []
        while True:
            if self.tok.kind != NAME:
                self.fail(f"{op_tok.text}[...] takes the names of the indices it reduces")
            name_tok = self.advance()
            self.check_name_free(name_tok, "index")
            if name_tok.text in names:
                self.error(f"index {name_tok.text} is listed twice in {op_tok.text}[...]",
                           name_tok.start, name_tok.end, cls=_index_rule_error())
            names.append(name_tok.text)
            if not self.at(","):
                break
            self.advance()
        self.expect("]", "to close the reduction's indices")
        self.expect("(", f"after {op_tok.text}[{', '.join(names)}]: the reduced expression")
        body = self.expr()
        self.expect(")", f"to close {op_tok.text}[...](")
        return Reduce(op_tok.text, tuple(names), body, span=(op_tok.start, self.prev_end()))

    def call(self) -> Expr:
        func_tok = self.advance()
        func = func_tok.text
        arities = _arity(func)
        if not arities:
            functions = ", ".join(FUNCTIONS)
            if func in REDUCTIONS + SUGAR_REDUCTIONS + POSITION_REDUCTIONS:
                message = f"{func!r} is a reduction: write {func}[k](...)"
            elif func in PLANNED_REDUCTIONS:
                message = f"{func!r} is not part of the notation yet (neither as a function " \
                          f"nor as a reduction); the reductions are {_REDUCTION_LIST}, the " \
                          f"functions {functions}"
            else:
                message = f"{func!r} is not a function of the notation" \
                          f"{_suggest(func, FUNCTIONS)}; the functions are {functions}"
            self.error(message, func_tok.start, func_tok.end, cls=EinfuseNameError)
        self.expect("(", "")
        args: List[Expr] = []
        if not self.at(")"):
            while True:
                args.append(self.expr())
                if not self.at(","):
                    break
                self.advance()
        self.expect(")", f"to close {func}(")
        span = (func_tok.start, self.prev_end())
        if len(args) not in arities:
            wanted = " or ".join(str(a) for a in arities)
            self.error(f"{func}() takes {wanted} argument(s), got {len(args)}", *span)
        return Call(func, tuple(args), span=span)

    def access(self, name_tok: Token) -> Access:
        opener = self.pos
        outer, self.reading = getattr(self, "reading", None), name_tok.text
        self.expect("[", "")
        subs: List[IndexExpr] = []
        try:
            if not self.at("]"):
                while True:
                    sub_start = self.tok.start
                    sub = self.expr()
                    subs.append(self.subscript(sub, (sub_start, self.prev_end())))
                    if not self.at(","):
                        break
                    self.advance()
            self.expect("]", f"to close {name_tok.text}[")
        except EinfuseSyntaxError:
            # An unclosed '[' swallows the rest of the statement into its subscripts;
            # whatever then fails to parse there, the missing ']' is the cause.
            if opener in self.unclosed:
                self.error(f"a ']' is missing: {name_tok.text}[ is never closed",
                           name_tok.start, self.tokens[opener].end)
            raise
        self.reading = outer
        return Access(name_tok.text, tuple(subs), span=(name_tok.start, self.prev_end()))

    # -- subscripts ----------------------------------------------------------------------
    def subscript(self, expr: Expr, span: Tuple[int, int]) -> IndexExpr:
        return SubscriptBuilder(self.error, self.source).subscript(expr, span, self.reading)


def _fits_int64(value: int) -> bool:
    return -INT64_MAX <= value <= INT64_MAX


def _index_rule_error():
    from ..errors import IndexRuleError
    return IndexRuleError


class _Resolver:
    """Turns bare names into index values or scalar parameters, and checks that
    no name plays two roles (tensor, index, parameter, output)."""

    def __init__(self, statement: Statement):
        self.statement = statement
        self.source = statement.source
        self.indices: Set[str] = set(statement.output_indices)
        self.tensors: Dict[str, Tuple[int, int]] = {}
        for node in statement.rhs.walk():
            if isinstance(node, Access):
                self.tensors.setdefault(node.tensor, node.span)
                for sub in node.indices:
                    self.indices.update(sub.index_names)
            elif isinstance(node, Reduce):
                self.indices.update(node.indices)

    def resolve(self) -> Statement:
        for name, span in self.tensors.items():
            if name in self.indices:
                raise EinfuseNameError(f"{name} is used both as a tensor and as an index",
                                       source=self.source, span=span)
        if self.statement.output in self.indices:
            raise EinfuseNameError(f"{self.statement.output} is used both as the output and "
                                   "as an index", source=self.source,
                                   span=self.statement.output_span)
        self.fresh = FreshNames(names_in(self.statement))
        self.expanded = False
        rhs = self.visit(self.statement.rhs)
        return dataclasses.replace(self.statement, rhs=rhs, expanded=self.expanded)

    def visit(self, expr: Expr) -> Expr:
        if isinstance(expr, Param):
            if expr.name in self.indices:
                return IndexValue(expr.name, span=expr.span)
            if expr.name in self.tensors:
                raise EinfuseNameError(f"{expr.name} is a tensor elsewhere in the statement; "
                                       "use it with brackets", source=self.source,
                                       span=expr.span)
            return expr
        expr = map_children(expr, self.visit)
        if isinstance(expr, Reduce) and expr.op in SUGAR_REDUCTIONS:
            self.expanded = True
            return expand(expr, self.fresh)
        return expr
