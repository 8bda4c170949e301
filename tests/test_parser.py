"""The parser: every construct of the notation, name resolution, the printer round
trip, and syntax errors with carets under the offending part of the statement."""

import math

import pytest

import einfuse as ef
from einfuse import errors
from einfuse.lang import parse
from einfuse.lang.ast import (BINARY_FUNCTIONS, UNARY_FUNCTIONS, Access, Binary, Call,
                              IndexExpr, IndexValue, Number, Param, Reduce, Statement, Unary)
from einfuse.lang.printer import format_statement


# -- helpers -----------------------------------------------------------------------------

def ix(*terms, const=0, gathers=()):
    """A subscript: ix("i") is plain i; ix(("i", 2), "a", const=-1) is 2*i + a - 1."""
    pairs = [(t, 1) if isinstance(t, str) else t for t in terms]
    return IndexExpr(tuple(pairs), tuple(gathers), const)


def normal(sub):
    """A subscript's meaning, independent of the order its terms are kept in."""
    return dict(sub.terms), sub.gathers, sub.constant


def acc(tensor, *subs):
    """An access; a str subscript is a plain index, an int a constant."""
    return Access(tensor, tuple(ix(s) if isinstance(s, str) else
                                ix(const=s) if isinstance(s, int) else s for s in subs))


def rhs(text):
    """The resolved right side of ``y := text`` (bare names stay parameters unless they
    are indices somewhere in the statement)."""
    return parse(f"y := {text}").rhs


def caret_span(error, source):
    """(start, end) columns of the caret run under ``source`` in str(error)."""
    lines = str(error).split("\n")
    shown = "    " + source
    assert shown in lines, f"statement not shown in:\n{error}"
    caret = lines[lines.index(shown) + 1]
    assert caret.startswith("    ") and set(caret.strip()) == {"^"}, \
        f"no caret line under the statement in:\n{error}"
    start = len(caret) - len(caret.lstrip(" ")) - 4
    return start, start + len(caret.strip())


# -- statements ----------------------------------------------------------------------------

@pytest.mark.parametrize("op", [":=", "=", "+="])
def test_assignment_operators(op):
    st = parse(f"C[i,j] {op} A[i,k] * B[k,j]")
    assert isinstance(st, Statement)
    assert (st.output, st.output_indices, st.assign) == ("C", ("i", "j"), op)
    assert st.creates_output == (op == ":=")
    assert st.rhs == Binary("*", acc("A", "i", "k"), acc("B", "k", "j"))


def test_scalar_output_and_empty_brackets():
    plain = parse("s := x[i] * y[i]")
    assert (plain.output, plain.output_indices, plain.assign) == ("s", (), ":=")
    assert parse("s[] := x[i] * y[i]") == plain
    for op in ("=", "+="):
        assert parse(f"total {op} x[i]").output_indices == ()


def test_zero_d_access():
    assert rhs("x[i] - m[]") == Binary("-", acc("x", "i"), Access("m", ()))
    assert parse("y[i] := m[] * x[i]").rhs.left == Access("m", ())


def test_spacing_and_newlines_do_not_matter():
    a = parse("C[i,j]:=A[i,k]*B[k,j]")
    b = parse("  C[ i , j ]  :=\n   A[i, k]\t*  B[k,\n j]  ")
    assert a == b
    assert a.source != b.source  # the source is kept for carets, not compared


def test_comments():
    base = parse("Y[b, o] := sum[i](X[b, i] * W[i, o]) + bias[o]")
    text = """
        # a linear layer
        Y[b, o] := sum[i](X[b, i] * W[i, o])   # the matrix product
                 + bias[o]                     # added once per (b, o)
    """
    assert parse(text) == base
    assert parse("y[i] := x[i] #") == parse("y[i] := x[i]")
    assert parse("y[i] := x[i] # 1 + $ ] junk") == parse("y[i] := x[i]")


# -- numbers and constants -----------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("2", 2), ("0", 0), ("0.5", 0.5), (".5", 0.5), ("3.", 3.0), ("1e-6", 1e-6),
    ("2.5E3", 2500.0), ("1e3", 1000.0), ("pi", math.pi), ("inf", math.inf),
    ("-1", -1), ("-inf", -math.inf), ("-0.5", -0.5),
])
def test_numbers_and_constants(text, value):
    node = rhs(text)
    assert isinstance(node, Number)
    assert node.value == value
    assert type(node.value) is type(value)


def test_nan_constant():
    node = rhs("nan")
    assert isinstance(node, Number) and isinstance(node.value, float) and math.isnan(node.value)


# -- functions -----------------------------------------------------------------------------

@pytest.mark.parametrize("func", UNARY_FUNCTIONS)
def test_unary_functions(func):
    assert rhs(f"{func}(x[i])") == Call(func, (acc("x", "i"),))


@pytest.mark.parametrize("func", BINARY_FUNCTIONS)
def test_binary_functions(func):
    assert rhs(f"{func}(x[i], 2)") == Call(func, (acc("x", "i"), Number(2)))


def test_where_and_nested_calls():
    assert rhs("where(x[i] > 0, x[i], 0.1 * x[i])") == Call("where", (
        Binary(">", acc("x", "i"), Number(0)), acc("x", "i"),
        Binary("*", Number(0.1), acc("x", "i"))))
    assert rhs("min(max(x[i], lo), hi)") == Call("min", (
        Call("max", (acc("x", "i"), Param("lo"))), Param("hi")))


def test_all_spec_functions_are_known():
    spec_functions = ("exp log log1p expm1 sqrt abs sin cos tanh sigmoid relu softplus "
                      "erf floor ceil").split()
    assert set(spec_functions) <= set(UNARY_FUNCTIONS)
    assert {"min", "max", "pow"} <= set(BINARY_FUNCTIONS)


# -- reductions ----------------------------------------------------------------------------

def test_implicit_reduction_is_not_in_the_tree():
    st = parse("C[i,j] := A[i,k] * B[k,j]")
    assert not any(isinstance(node, Reduce) for node in st.rhs.walk())


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "logsumexp"])
def test_explicit_reductions(op):
    assert rhs(f"{op}[j](X[i,j])") == Reduce(op, ("j",), acc("X", "i", "j"))


def test_reduction_over_several_indices():
    assert parse("s := sum[k,l](A[k,l] * B[l,k])").rhs == Reduce(
        "sum", ("k", "l"), Binary("*", acc("A", "k", "l"), acc("B", "l", "k")))


def test_nested_reductions_and_finalisers():
    st = parse("Z[i] := log(sum[j](exp(X[i,j] - M[i])))")
    assert st.rhs == Call("log", (Reduce("sum", ("j",), Call("exp", (
        Binary("-", acc("X", "i", "j"), acc("M", "i")),))),))
    st = parse("N[i] := sqrt(sum[j](X[i,j]**2))")
    assert st.rhs == Call("sqrt", (Reduce("sum", ("j",), Binary(
        "**", acc("X", "i", "j"), Number(2))),))
    st = parse("v := max[i](sum[j](abs(A[i,j])))")
    assert st.rhs == Reduce("max", ("i",), Reduce("sum", ("j",), Call(
        "abs", (acc("A", "i", "j"),))))
    st = parse("P[i,j] := exp(X[i,j] - logsumexp[k](X[i,k]))")
    assert st.rhs == Call("exp", (Binary("-", acc("X", "i", "j"), Reduce(
        "logsumexp", ("k",), acc("X", "i", "k"))),))


def test_reduction_inside_arithmetic():
    assert parse("mu[i] := sum[j](X[i,j]) / n").rhs == Binary(
        "/", Reduce("sum", ("j",), acc("X", "i", "j")), Param("n"))


def test_min_max_two_forms():
    assert rhs("max[j](X[i,j])") == Reduce("max", ("j",), acc("X", "i", "j"))
    assert rhs("max(a, b)") == Call("max", (Param("a"), Param("b")))


# -- operators and precedence --------------------------------------------------------------

@pytest.mark.parametrize("text, explicit", [
    ("a + b * c", "a + (b * c)"),
    ("a * b + c", "(a * b) + c"),
    ("a - b - c", "(a - b) - c"),
    ("a / b / c", "(a / b) / c"),
    ("a * b / c", "(a * b) / c"),
    ("a ** b ** c", "a ** (b ** c)"),
    ("-a ** 2", "-(a ** 2)"),
    ("-a * b", "(-a) * b"),
    ("a ** -b", "a ** (-b)"),
    ("a + b < c * d", "(a + b) < (c * d)"),
    ("a & b | c", "(a & b) | c"),
    ("a | b & c", "a | (b & c)"),
    ("a + b & c + d", "(a + b) & (c + d)"),
    ("a < b & c", "a < (b & c)"),      # Python: comparisons bind looser than & and |
    ("a == b | c", "a == (b | c)"),
    ("+a", "a"),
    ("a - -b", "a - (-b)"),
    ("--a", "-(-a)"),
])
def test_precedence_is_pythons(text, explicit):
    assert rhs(text) == rhs(explicit)


def test_unary_minus_binds_looser_than_power():
    assert rhs("-x[i]**2") == Unary("-", Binary("**", acc("x", "i"), Number(2)))
    assert rhs("-2**2") == Unary("-", Binary("**", Number(2), Number(2)))
    assert rhs("(-2)**2") == Binary("**", Number(-2), Number(2))


def test_power_with_negative_exponent():
    assert rhs("2**-1") == Binary("**", Number(2), Number(-1))
    assert rhs("2**-k") == Binary("**", Number(2), Unary("-", Param("k")))


@pytest.mark.parametrize("op", ["<", "<=", ">", ">=", "==", "!="])
def test_comparisons(op):
    assert rhs(f"x[i] {op} 0") == Binary(op, acc("x", "i"), Number(0))


def test_comparison_chains_like_python():
    assert rhs("a < b < c") == Binary("&", Binary("<", Param("a"), Param("b")),
                                      Binary("<", Param("b"), Param("c")))
    assert rhs("a < b <= c == d") == Binary("&", Binary(
        "&", Binary("<", Param("a"), Param("b")), Binary("<=", Param("b"), Param("c"))),
        Binary("==", Param("c"), Param("d")))
    # a parenthesised comparison is not a chain
    assert rhs("(a < b) < c") == Binary("<", Binary("<", Param("a"), Param("b")), Param("c"))


def test_logical_operators():
    assert rhs("(a < b) & (b < c)") == rhs("a < b < c")
    assert rhs("(x[i] > 0) | (x[i] < -1)") == Binary(
        "|", Binary(">", acc("x", "i"), Number(0)), Binary("<", acc("x", "i"), Number(-1)))


# -- subscripts ------------------------------------------------------------------------------

@pytest.mark.parametrize("sub, expected", [
    ("i", ix("i")),
    ("i + 1", ix("i", const=1)),
    ("1 + i", ix("i", const=1)),
    ("i - 1", ix("i", const=-1)),
    ("i + a", ix("i", "a")),
    ("2*i + a - 1", ix(("i", 2), "a", const=-1)),
    ("i*2 + a - 1", ix(("i", 2), "a", const=-1)),
    ("3*(i + 1)", ix(("i", 3), const=3)),
    ("i + i", ix(("i", 2))),
    ("2*i - i", ix("i")),
    ("i - i + 2", ix(const=2)),
    ("(i + a) - (a - 4)", ix("i", const=4)),
    ("5", ix(const=5)),
    ("0", ix(const=0)),
    ("-1 + 2", ix(const=1)),
])
def test_affine_subscripts(sub, expected):
    st = parse(f"y[i] := x[{sub}] * k[a]") if "a" in sub else parse(f"y[i] := x[{sub}]")
    access = next(node for node in st.rhs.walk() if isinstance(node, Access)
                  and node.tensor == "x")
    assert len(access.indices) == 1
    assert normal(access.indices[0]) == normal(expected)


def test_multi_axis_and_constant_subscripts():
    assert parse("c[i] := D[i, 5]").rhs == acc("D", "i", 5)
    st = parse("o[y,x] := img[y + dy, x + dx] * K[dy, dx]")
    assert st.rhs.right == acc("K", "dy", "dx")
    img = st.rhs.left
    assert img.tensor == "img"
    assert [normal(sub) for sub in img.indices] == [normal(ix("y", "dy")),
                                                    normal(ix("x", "dx"))]


def test_plain_and_affine_properties():
    assert ix("i").plain_index == "i" and not ix("i").is_affine
    assert ix("i", const=1).plain_index is None and ix("i", const=1).is_affine
    assert ix(("i", 2)).is_affine


def test_gathers():
    idx_b = acc("idx", "b")
    assert parse("y[b,d] := W[idx[b], d]").rhs == Access(
        "W", (ix(gathers=((idx_b, 1),)), ix("d")))
    tok = acc("tok", "b", "t")
    assert parse("h[b,t,d] := E[tok[b, t], d]").rhs == Access(
        "E", (ix(gathers=((tok, 1),)), ix("d")))


def test_gather_with_affine_parts():
    idx_i = acc("idx", "i")
    assert parse("y[i] := x[idx[i] + 1]").rhs == Access(
        "x", (ix(gathers=((idx_i, 1),), const=1),))
    assert parse("y[i] := x[2*idx[i]]").rhs == Access("x", (ix(gathers=((idx_i, 2),)),))
    assert parse("y[i] := x[idx[i + 1] - 1]").rhs == Access(
        "x", (ix(gathers=((Access("idx", (ix("i", const=1),)), 1),), const=-1),))


def test_nested_gathers():
    inner = acc("q", "i")
    middle = Access("p", (ix(gathers=((inner, 1),)),))
    assert parse("y[i] := x[p[q[i]]]").rhs == Access("x", (ix(gathers=((middle, 1),)),))
    assert parse("v[n] := A[r[n], c[n]]").rhs == Access(
        "A", (ix(gathers=((acc("r", "n"), 1),)), ix(gathers=((acc("c", "n"), 1),))))


# -- bare names: index values or parameters -----------------------------------------------

@pytest.mark.parametrize("text, name, kind", [
    ("y[i] := x[i] * i", "i", IndexValue),                 # output index
    ("y[i] := x[i] * n", "n", Param),                      # not an index anywhere
    ("y[i] := x[i, j] / (j + 1)", "j", IndexValue),        # index inside a subscript
    ("y[i] := j * x[i, j]", "j", IndexValue),              # ... even when used before it
    ("y[i] := sum[j](x[i] * j)", "j", IndexValue),         # bound by a reduction
    ("y[i] := x[i + a] * a", "a", IndexValue),             # inside an affine subscript
    ("y[i] := x[idx[k]] * k", "k", IndexValue),            # inside a gather's subscript
    ("y[i] := alpha * x[i] + beta", "alpha", Param),
    ("y[i] := alpha * x[i] + beta", "beta", Param),
    ("s := alpha", "alpha", Param),
])
def test_bare_name_resolution(text, name, kind):
    found = [node for node in parse(text).rhs.walk()
             if isinstance(node, (IndexValue, Param)) and node.name == name]
    assert found and all(type(node) is kind for node in found)


def test_causal_mask_resolution():
    st = parse("M[i,j] := where(j <= i, S[i,j], -inf)")
    assert st.rhs == Call("where", (Binary("<=", IndexValue("j"), IndexValue("i")),
                                    acc("S", "i", "j"), Number(-math.inf)))


# -- printer round trip ----------------------------------------------------------------------

ROUND_TRIP = [
    "C[i,j] := A[i,k] * B[k,j]",
    "C[i,j] = A[i,k] * B[k,j]",
    "C[i,j] += A[i,k] * B[k,j]",
    "s := x[i] * y[i]",
    "s[] := x[i]",
    "y[i] := x[i] - m[]",
    "y[b,o] := sum[i](x[b,i]*W[i,o]) + bias[o]",
    "Z[i] := log(sum[j](exp(X[i,j] - M[i])))",
    "N[i] := sqrt(sum[j](X[i,j]**2))",
    "v := max[i](sum[j](abs(A[i,j])))",
    "z[i] := logsumexp[j](X[i,j])",
    "lo := min[i,j](X[i,j])",
    "p[j] := prod[i](X[i,j])",
    "y[i] := -x[i]**2",
    "y[i] := (-x[i])**2",
    "y[i] := (-2)**x[i]",
    "y[i] := 2**-x[i]",
    "y[i] := 2**-1 * x[i]",
    "y[i] := x[i] ** y[i] ** 2",
    "y[i] := (x[i] ** y[i]) ** 2",
    "y[i] := a - (b - x[i])",
    "y[i] := a / (b * x[i])",
    "y[i] := a - -x[i]",
    "y[i] := -(-x[i])",
    "y[i] := -(x[i] + 1)",
    "M[i,j,k] := i < j < k",
    "M[i,j,k] := (i < j) < k",
    "M[i,j,k] := (i < j) & (j < k)",
    "M[i,j,k] := i < (j & j) < k",
    "p[i] := (x[i] > 0) | (x[i] <= -1) & (x[i] != 2)",
    "p[i] := (x[i] > 0) == (y[i] >= 1)",
    "r[i] := (x[i] > 0) * x[i]",
    "y[i] := where(x[i] > 0, x[i], 0.1 * x[i])",
    "y[i] := min(max(x[i], lo), hi)",
    "y[i] := pow(x[i], 3) + log1p(x[i]) - expm1(x[i])",
    "g[i] := 0.5 * x[i] * (1 + erf(x[i] / sqrt(2)))",
    "y[i] := sigmoid(x[i]) + relu(x[i]) + softplus(x[i]) + tanh(x[i])",
    "y[i] := floor(x[i]) + ceil(x[i]) + sin(x[i]) * cos(x[i])",
    "M[i,j] := where(j <= i, S[i,j], -inf)",
    "y[i] := x[i] * 1e-6 + 2.5E3 + .5 + 3. + 1e20 + pi + nan",
    "y[i] := x[2*i + a - 1] * k[a]",
    "y[i] := x[i - 1] + x[1 - i] + x[3*(i + 1)]",
    "c[i] := D[i, 5] + D[i, 0] + D[i, -1]",
    "h[b,t,d] := E[tok[b, t], d]",
    "y[i] := x[idx[i] + 1] + x[2*idx[i] - 3] + x[-idx[i]]",
    "y[i] := x[p[q[i]]]",
    "o[r,c] := img[r + dr, c + dc] * K[dr, dc]",
    "y[i,j] := A[i,j] / (j + 1)",
    "S[i,j] := where(j <= i, sum[d](Q[i,d] * K[j,d]) * scale, -inf)",
    "y[i] := alpha * x[idx[i]] + beta",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_printer_round_trip(text):
    st = parse(text)
    printed = format_statement(st)
    again = parse(printed)
    assert again == st, printed
    assert format_statement(again) == printed  # printing is a fixed point


# -- syntax errors ---------------------------------------------------------------------------

def _nth(source, token, n=0):
    col = -1
    for _ in range(n + 1):
        col = source.index(token, col + 1)
    return col


# (source, error class, offending text, which occurrence, words the message must contain)
SYNTAX_ERRORS = [
    # unexpected characters
    ("y[i] := x[i] $ 2", errors.EinfuseSyntaxError, "$", 0, ["'$'"]),
    ("y[i] := x[i] ! 2", errors.EinfuseSyntaxError, "!", 0, ["'!'"]),
    ("y[i] := x[i] ~", errors.EinfuseSyntaxError, "~", 0, ["'~'"]),
    ("y[i] := 2x[i]", errors.EinfuseSyntaxError, "2x", 0, ["number"]),
    # missing assignment operator
    ("y[i] x[i]", errors.EinfuseSyntaxError, "x", 0, [":="]),
    ("y[i] == x[i]", errors.EinfuseSyntaxError, "==", 0, [":="]),
    ("y[i+1] := x[i]", errors.EinfuseSyntaxError, "+", 0, ["+"]),
    (":= x[i]", errors.EinfuseSyntaxError, ":=", 0, ["output"]),
    # trailing text
    ("y[i] := x[i] x[i]", errors.EinfuseSyntaxError, "x", 1, ["'x'"]),
    ("y[i] := x[i])", errors.EinfuseSyntaxError, ")", 0, ["')'"]),
    ("y[i] := x[i] = 2", errors.EinfuseSyntaxError, "=", 1, ["'='"]),
    ("y[i] := x[i] /// 2", errors.EinfuseSyntaxError, "/", 2, ["'/'"]),
    ("y[i] := x[i] % % 2", errors.EinfuseSyntaxError, "%", 1, ["'%'"]),
    # subscripts
    ("y[i] := x[0.5]", errors.EinfuseSyntaxError, "0.5", 0, ["integer"]),
    ("y[i] := x[i + 0.5]", errors.EinfuseSyntaxError, "0.5", 0, ["integer"]),
    ("y[i] := x[2.0*i]", errors.EinfuseSyntaxError, "2.0", 0, ["integer"]),
    ("y[i] := x[i*j]", errors.EinfuseSyntaxError, "i*j", 0, ["integer constant"]),
    ("y[i] := x[n*i]", errors.EinfuseSyntaxError, "n*i", 0, ["integer constant"]),
    ("y[i] := x[i/2]", errors.EinfuseSyntaxError, "i/2", 0, ["subscript"]),
    ("y[i] := x[exp(i)]", errors.EinfuseSyntaxError, "exp(i)", 0, ["subscript"]),
    ("y[i] := x[i**2]", errors.EinfuseSyntaxError, "i**2", 0, ["subscript"]),
    ("y[i] := x[sum[j](j)]", errors.EinfuseSyntaxError, "sum[j](j)", 0, ["subscript"]),
    # // and % in subscripts: a positive integer constant divisor, no gathers, no nesting
    ("y[i] := x[i // 0]", errors.EinfuseSyntaxError, "0", 0, ["divisor", "positive", "not 0"]),
    ("y[i] := x[i % -3]", errors.EinfuseSyntaxError, "-3", 0, ["'%'", "positive", "-3"]),
    ("y[i] := x[i // (2 - 5)]", errors.EinfuseSyntaxError, "2 - 5", 0, ["positive", "-3"]),
    ("y[i] := x[i // 2.0]", errors.EinfuseSyntaxError, "2.0", 0, ["divisor", "float 2.0"]),
    ("y[i,j] := x[i // j]", errors.EinfuseSyntaxError, "j", 1, ["divisor", "the index j"]),
    ("y[i] := x[i % n]", errors.EinfuseSyntaxError, "n", 0, ["'%'", "the index n"]),
    ("y[i] := x[i // idx[i]]", errors.EinfuseSyntaxError, "idx[i]", 0, ["a gather"]),
    ("y[i] := x[idx[i] // 2 + 1]", errors.EinfuseSyntaxError, "idx[i]", 0,
     ["'//'", "gather", "index array"]),
    ("y[i] := x[(i // 2) // 3]", errors.EinfuseSyntaxError, "i // 2", 0,
     ["another", "i // 6"]),
    ("y[i] := x[idx[i] + i % 2]", errors.EinfuseSyntaxError, "idx[i] + i % 2", 0,
     ["'//' or '%'", "index array"]),
    ("y[i,j] := x[(i % 4) * (j % 2)]", errors.EinfuseSyntaxError, "(i % 4) * (j % 2)", 0,
     ["integer constant"]),
    # reserved names as tensor, index, parameter, output
    ("y[i] := exp[i]", errors.EinfuseNameError, "exp", 0, ["'exp'", "reserved"]),
    ("y[i] := 2 * where[i]", errors.EinfuseNameError, "where", 0, ["'where'", "reserved"]),
    ("y[i] := x[i, tanh]", errors.EinfuseNameError, "tanh", 0, ["'tanh'", "reserved"]),
    ("y[exp] := x[exp]", errors.EinfuseNameError, "exp", 0, ["'exp'", "index"]),
    ("y[i] := sum[log](x[i, log])", errors.EinfuseNameError, "log", 0, ["'log'", "index"]),
    ("y[i] := x[i] * sqrt", errors.EinfuseNameError, "sqrt", 0, ["'sqrt'", "reserved"]),
    ("y[i] := x[i] * sum", errors.EinfuseNameError, "sum", 0, ["'sum'", "sum[k]"]),
    ("exp[i] := x[i]", errors.EinfuseNameError, "exp", 0, ["'exp'", "output"]),
    ("pi := x[i]", errors.EinfuseNameError, "pi", 0, ["'pi'", "output"]),
    ("inf[i] := x[i]", errors.EinfuseNameError, "inf", 0, ["'inf'", "output"]),
    ("sum := x[i]", errors.EinfuseNameError, "sum", 0, ["'sum'", "output"]),
    ("y[max] := x[max]", errors.EinfuseNameError, "max", 0, ["'max'", "index"]),
    # functions: arity, reductions without brackets, unknown functions
    ("y[i] := exp(x[i], 2)", errors.EinfuseSyntaxError, "exp(x[i], 2)", 0, ["exp", "1"]),
    ("y[i] := exp()", errors.EinfuseSyntaxError, "exp()", 0, ["exp", "1"]),
    ("y[i] := where(x[i] > 0, 2)", errors.EinfuseSyntaxError, "where(x[i] > 0, 2)", 0, ["where", "3"]),
    ("y[i] := pow(x[i])", errors.EinfuseSyntaxError, "pow(x[i])", 0, ["pow", "2"]),
    ("y[i] := min(x[i])", errors.EinfuseSyntaxError, "min(x[i])", 0, ["min", "2"]),
    ("y[i] := max(x[i], 1, 2)", errors.EinfuseSyntaxError, "max(x[i], 1, 2)", 0, ["max", "2"]),
    ("y[i] := sum(x[i])", errors.EinfuseNameError, "sum", 0, ["sum[k](...)"]),
    ("y[i] := prod(x[i])", errors.EinfuseNameError, "prod", 0, ["prod[k](...)"]),
    ("y[i] := logsumexp(x[i])", errors.EinfuseNameError, "logsumexp", 0,
     ["logsumexp[k](...)"]),
    ("y[i] := foo(x[i])", errors.EinfuseNameError, "foo", 0, ["'foo'"]),
    ("y[i] := 2 * gelu(x[i])", errors.EinfuseNameError, "gelu", 0, ["'gelu'"]),
    # reductions
    ("y[i] := sum[](x[i])", errors.EinfuseSyntaxError, "]", 1, ["sum"]),
    ("y[i] := sum[j]x[i,j]", errors.EinfuseSyntaxError, "x", 0, ["'('"]),
    ("y[i] := sum[j,j](x[i,j])", errors.IndexRuleError, "j", 1, ["j", "twice"]),
    # names and indices
    ("y[i,i] := x[i]", errors.IndexRuleError, "i", 1, ["index i", "repeated"]),
    ("y[i,j,i] := x[i,j]", errors.IndexRuleError, "i", 1, ["index i", "repeated"]),
    ("y[i] := x[x]", errors.EinfuseNameError, "x[x]", 0, ["x", "tensor", "index"]),
    ("y[i] := x[i] * i[i]", errors.EinfuseNameError, "i[i]", 0, ["i", "tensor", "index"]),
    ("y[i] := x[i] + x", errors.EinfuseNameError, "x", 1, ["x", "brackets"]),
    ("y[i] := x[y]", errors.EinfuseNameError, "y", 0, ["y", "output", "index"]),
]


@pytest.mark.parametrize("source, cls, token, nth, words", SYNTAX_ERRORS,
                         ids=[case[0] for case in SYNTAX_ERRORS])
def test_syntax_errors(source, cls, token, nth, words):
    with pytest.raises(cls) as info:
        ef.compile(source)
    error = info.value
    assert isinstance(error, ef.EinfuseError)
    assert isinstance(error, ValueError)
    text = str(error)
    for word in words:
        assert word in text, f"{word!r} missing from:\n{text}"
    col = _nth(source, token, nth)
    assert caret_span(error, source) == (col, col + len(token)), text


@pytest.mark.parametrize("source, opening", [
    ("y[i] := x[i", "x["),
    ("y[i] := (x[i] + 1", "("),
    ("y[i] := exp(x[i]", "exp("),
    ("y[i] := sum[j](x[i,j]", "sum[j]("),
    ("y[i := x[i]", "["),
    ("y[i] := x[i] ** ", None),
    ("y[i] := x[i] +", None),
    ("y[i] := x[i] < ", None),
    ("y[i] := ", None),
])
def test_unfinished_statements(source, opening):
    with pytest.raises(errors.EinfuseSyntaxError) as info:
        ef.compile(source)
    assert isinstance(info.value, ef.EinfuseError) and isinstance(info.value, ValueError)
    start, _ = caret_span(info.value, source)
    # the caret marks where the statement ends too early (or the bracket left open)
    allowed = {len(source.rstrip()), len(source)}
    if opening is not None:
        allowed.add(source.index(opening) + len(opening) - 1)
        allowed.add(source.index(opening))
    if source == "y[i := x[i]":   # the ':=' is where ']' was expected
        allowed.add(source.index(":="))
    assert start in allowed, str(info.value)


def test_errors_from_parse_directly_carry_the_statement():
    source = "y[i] := x[i*j]"
    with pytest.raises(errors.EinfuseSyntaxError) as info:
        parse(source)
    assert info.value.source == source
    assert caret_span(info.value, source) == (10, 13)


def test_error_classes_are_also_builtin_exceptions():
    assert issubclass(errors.EinfuseSyntaxError, ValueError)
    assert issubclass(errors.EinfuseNameError, ValueError)
    assert issubclass(errors.IndexRuleError, ValueError)
    for cls in (errors.EinfuseSyntaxError, errors.EinfuseNameError, errors.IndexRuleError):
        assert issubclass(cls, ef.EinfuseError)


@pytest.mark.parametrize("statement", [None, b"y[i] := x[i]", 3.5])
def test_non_string_statement(statement):
    with pytest.raises(errors.EinfuseSyntaxError) as info:
        parse(statement)
    assert isinstance(info.value, ef.EinfuseError) and isinstance(info.value, ValueError)
    assert type(statement).__name__ in str(info.value)


def test_non_string_statement_through_the_api():
    with pytest.raises(errors.EinfuseSyntaxError) as info:
        ef.compile(None)
    assert "NoneType" in str(info.value)
