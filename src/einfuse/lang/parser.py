"""Recursive-descent parser for one einfuse statement, with Python's precedence.

    statement  := lhs (':=' | '=' | '+=') expr
    lhs        := NAME [ '[' [NAME (',' NAME)*] ']' ]
    expr       := bitor (cmp_op bitor)*          comparisons chain as in Python
    bitor      := bitand ('|' bitand)*
    bitand     := arith ('&' arith)*
    arith      := term (('+'|'-') term)*
    term       := unary (('*'|'/') unary)*
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
from typing import Dict, List, Optional, Set, Tuple

from ..errors import EinfuseNameError, EinfuseSyntaxError
from .ast import (ASSIGN_OPS, BINARY_FUNCTIONS, COMPARISON_OPS, CONSTANTS, REDUCTIONS,
                  RESERVED, TERNARY_FUNCTIONS, UNARY_FUNCTIONS, Access, Binary, Call, Expr,
                  IndexExpr, IndexValue, Number, Param, Reduce, Statement, Unary,
                  map_children)
from .lexer import END, NAME, NUMBER, OP, Token, tokenize


def parse(source: str) -> Statement:
    """Parse ``source`` into a :class:`Statement` (names resolved)."""
    if not isinstance(source, str):
        raise EinfuseSyntaxError(f"a statement must be a string, not {type(source).__name__}")
    try:
        return _Parser(source).statement()
    except RecursionError:
        raise EinfuseSyntaxError("the statement nests too deeply to parse", source=source,
                                 span=(0, len(source))) from None


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
        return self.binary_level(("*", "/"), self.unary)

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
            value = int(text) if text.isdigit() else float(text)
            return Number(value, span=(token.start, token.end))
        if self.at("("):
            self.advance()
            inner = self.expr()
            self.expect(")", "to close '('")
            return inner
        if token.kind != NAME:
            self.fail("expected a number, a name or '('")
        name = token.text
        nxt = self.peek()
        if name in REDUCTIONS and nxt.kind == OP and nxt.text == "[":
            return self.reduction()
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
            what = "a reduction: write " + func + "[k](...)" if func in REDUCTIONS else \
                "not a function of the notation"
            self.error(f"{func!r} is {what}", func_tok.start, func_tok.end,
                       cls=EinfuseNameError)
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
        self.expect("[", "")
        subs: List[IndexExpr] = []
        if not self.at("]"):
            while True:
                sub_start = self.tok.start
                sub = self.expr()
                subs.append(self.subscript(sub, (sub_start, self.prev_end())))
                if not self.at(","):
                    break
                self.advance()
        self.expect("]", f"to close {name_tok.text}[")
        return Access(name_tok.text, tuple(subs), span=(name_tok.start, self.prev_end()))

    # -- subscripts ----------------------------------------------------------------------
    def subscript(self, expr: Expr, span: Tuple[int, int]) -> IndexExpr:
        terms, gathers, constant = self.linear(expr)
        return IndexExpr(tuple((n, c) for n, c in terms.items() if c != 0),
                         tuple((a, c) for a, c in gathers if c != 0), constant, span=span)

    def linear(self, expr: Expr):
        """``expr`` as (index coefficients, gathers, constant), or a syntax error."""
        if isinstance(expr, Number):
            if isinstance(expr.value, float):
                self.error("a subscript constant must be an integer", *expr.span)
            return {}, [], expr.value
        if isinstance(expr, Param):
            return {expr.name: 1}, [], 0
        if isinstance(expr, Access):
            return {}, [(expr, 1)], 0
        if isinstance(expr, Unary) and expr.op == "-":
            terms, gathers, constant = self.linear(expr.operand)
            return {n: -c for n, c in terms.items()}, [(a, -c) for a, c in gathers], -constant
        if isinstance(expr, Binary) and expr.op in ("+", "-"):
            lt, lg, lc = self.linear(expr.left)
            rt, rg, rc = self.linear(expr.right)
            sign = 1 if expr.op == "+" else -1
            terms = dict(lt)
            for name, coeff in rt.items():
                terms[name] = terms.get(name, 0) + sign * coeff
            return terms, lg + [(a, sign * c) for a, c in rg], lc + sign * rc
        if isinstance(expr, Binary) and expr.op == "*":
            left, right = self.linear(expr.left), self.linear(expr.right)
            for factor, other in ((left, right), (right, left)):
                if not factor[0] and not factor[1]:
                    scale = factor[2]
                    return ({n: scale * c for n, c in other[0].items()},
                            [(a, scale * c) for a, c in other[1]], scale * other[2])
            self.error("a subscript may multiply an index only by an integer constant",
                       *expr.span)
        self.error("a subscript must be an index, an integer, a gather (idx[i]) or an "
                   "affine combination of them such as 2*i + a - 1", *expr.span)


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
        rhs = self.visit(self.statement.rhs)
        return dataclasses.replace(self.statement, rhs=rhs)

    def visit(self, expr: Expr) -> Expr:
        if isinstance(expr, Param):
            if expr.name in self.indices:
                return IndexValue(expr.name, span=expr.span)
            if expr.name in self.tensors:
                raise EinfuseNameError(f"{expr.name} is a tensor elsewhere in the statement; "
                                       "use it with brackets", source=self.source,
                                       span=expr.span)
            return expr
        return map_children(expr, self.visit)
