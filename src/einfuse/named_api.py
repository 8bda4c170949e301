"""Running named expressions (frontends/named.py): one einfuse program per request.

``expr.order(i, j)``, ``np.asarray(expr)``, ``ef.evaluate(...)`` and ``ef.explain(expr)``
look one expression up by its root's key (``_by_key``, built with the nodes), else walk
the DAG (frontends/named_program.structure), look its structural key up in
``_translations`` (a miss spells the program once: named_program.emit), and call
the compiled program -- ``ef.compile(text, **options)`` -- on the arrays, exactly as
``ef.ein`` would: the same kernels, fusion, hoisting, online-softmax attention, torch
autograd node and JAX rules.  A training step that rebuilds an equal expression finds
its translation and its compiled program by key and then takes the compiled program's
own fast path for a repeated call."""

from __future__ import annotations

import copy
from typing import Dict

from .errors import (EinfuseError, EinfuseSyntaxError, EinfuseTypeError, IndexRuleError,
                     OptionError, unexpected_keywords)
from .frontends import named as named_module
from .frontends.named import FUNCTIONS, Affine, Dim, Named, Slot, read, wrap
from .frontends.named_checks import DimInfo, Use, at_lines, error, merge_framework, merge_info
from .frontends.named_program import emit, order_spec, range_values, structure
from .api import compile as compile_statements
from .lang.ast import Access, IndexValue, Reduce
from .pictures import named_page, save_page

# the options of ef.compile that a materialisation passes on (ranges come from the
# dimensions' sizes, outputs from the request)
OPTIONS = ("pad", "bounds", "fill", "dtype", "backend", "threads", "memory_limit")
EXPLAIN_OPTIONS = ("gradients", "source", "mesh", "shard", "cost_model", "memory", "measure")

_translations: Dict[tuple, "_Entry"] = {}
_TRANSLATIONS_KEPT = 1024
_COMPILED_KEPT = 64          # per translation, by ranges


class _Entry:
    """A structure's translation and its compiled programs, by this call's ranges."""
    __slots__ = ("translation", "compiled")

    def __init__(self, translation):
        self.translation = translation
        self.compiled: Dict[tuple, object] = {}


def _options_key(options, where, function="order()"):
    if not options:
        return ()
    unknown = [name for name in options if name not in OPTIONS]
    if unknown:
        hint = " (a dimension's size is dim.size = n, not ranges=)" \
            if "ranges" in unknown else ""
        wrong = unexpected_keywords(function, unknown, OPTIONS + ("mesh", "shard"))
        raise type(wrong)(wrong.message + hint + at_lines(where))
    try:
        return tuple(sorted(options.items()))
    except TypeError:
        raise error(OptionError, f"{function}'s options must be hashable values, not "
                    f"{options!r}", where) from None


def _requests(requests, where, function):
    """(node, ordered dimensions, axis groups) for each request and their merged info."""
    roots, groups = [], []
    for node, items in requests:
        order, lengths = order_spec(node, items, where)
        roots.append((node, order))
        groups.append(lengths)
    nodes = [node for node, _ in roots]
    if len(nodes) == 1:
        info = nodes[0].info
    else:
        info = merge_info([n.info for n in nodes], where)
        framework = None
        for n in nodes:
            framework = merge_framework(framework, n.framework, where)
    return roots, groups, info


def _sized_since(info):
    """``dim.size = n`` set after the expression was built counts too."""
    return {name: DimInfo(entry.dim, Use(entry.dim._size, f"{name}.size = {entry.dim._size}",
                                         entry.dim._size_where, True))
            if entry.use is None and entry.dim._size is not None else entry
            for name, entry in info.items()}


def _entry(found) -> _Entry:
    entry = _translations.get(found.key)
    if entry is None:
        entry = _Entry(emit(found))
        if len(_translations) >= _TRANSLATIONS_KEPT:
            _translations.pop(next(iter(_translations)))
        _translations[found.key] = entry
    return entry


def translate(requests, options=None, where=None, function="order()"):
    """The translation, the walk's values and this call's ranges for ``requests``."""
    options = options or {}
    roots, groups, info = _requests(requests, where, function)
    if any(entry.use is None and entry.dim._size is not None for entry in info.values()):
        info = _sized_since(info)
    try:
        found = structure(roots, info, _options_key(options, where, function))
        entry = _entry(found)
    except RecursionError:     # the writer of the program text recurses over the nodes
        depth = max((getattr(root, "depth", 0) or 0 for root in roots), default=0)
        raise error(EinfuseSyntaxError,
                    f"the expression nests too deeply to compile ({depth} operations "
                    "deep): materialise a part of it first (.order(...)) and build on "
                    "that result", where) from None
    return entry, found, roots, groups, range_values(entry.translation, info)


# (root key, order, sizes, options) -> (_translations, its entry): an index into the
# translations by the root's structural key, valid while that table is the one in use
_by_key: Dict[tuple, tuple] = {}


def _looked_up(requests, options, where):
    """(entry, arrays, params, roots, groups, ranges) for ``requests``: one request is
    looked up by its root's structural key (frontends/named_node.py builds it with the node),
    with no walk; a miss, or several requests, walks the DAG (``translate``)."""
    if len(requests) == 1:
        node, items = requests[0]
        order, lengths = order_spec(node, items, where)
        info = node.info
        sized = []
        for name, entry in info.items():
            use = entry.use
            if use is None:
                if entry.dim._size is not None:     # dim.size = n since: the walk's way
                    sized = None
                    break
                sized.append((name, 0))
            else:
                sized.append((name, 2 if use.explicit else 1))
        if sized is not None:
            names = []
            for d in order:
                names.append(d.name)
            key = (node.key, tuple(names), tuple(sized), _options_key(options, where))
            held = _by_key.get(key)
            if held is not None and held[0] is _translations:
                entry = held[1]
                params = [value for _, value in node.params] if node.params else ()
                ranges = range_values(entry.translation, info) \
                    if entry.translation.ranged else ()
                return entry, node.arrays, params, [(node, order)], [lengths], ranges
            entry, found, roots, groups, ranges = translate(requests, options, where)
            if len(_by_key) >= _TRANSLATIONS_KEPT:
                _by_key.pop(next(iter(_by_key)))
            _by_key[key] = (_translations, entry)
            return entry, found.arrays, found.params, roots, groups, ranges
    entry, found, roots, groups, ranges = translate(requests, options, where)
    return entry, found.arrays, found.params, roots, groups, ranges


def materialise(requests, options, where):
    """Run ``requests`` ((expression, order items) pairs) as one program; one array per
    request, in the inputs' framework.  ``mesh=``/``shard=`` (shard by dimension) run it
    on a device mesh, as ``ef.compile(text, mesh=, shard=)`` runs the statements."""
    placement = {}
    if options and ("mesh" in options or "shard" in options):
        placement = {k: options[k] for k in ("mesh", "shard") if options.get(k) is not None}
        options = {k: v for k, v in options.items() if k not in ("mesh", "shard")}
    entry, arrays, params, roots, groups, ranges = _looked_up(requests, options, where)
    translation = entry.translation
    key = ranges
    if placement:
        if isinstance(placement.get("shard"), dict):
            placement["shard"] = _shard_by_index(placement["shard"], translation, where)
        key = (ranges, _placement_key(placement, where))
    compiled = entry.compiled.get(key)
    if compiled is None:
        try:
            compiled = compile_statements(
                translation.text, ranges=dict(ranges) or None,
                outputs=translation.outputs if len(translation.statements) > 1 else None,
                **options, **placement)
        except EinfuseError as problem:
            raise _in_context(problem, roots, where) from None
        if len(entry.compiled) >= _COMPILED_KEPT:     # (sizes given by dim.size vary)
            entry.compiled.pop(next(iter(entry.compiled)))
        entry.compiled[key] = compiled
    values = dict(zip(translation.tensors, arrays))
    if params:
        values.update(zip(translation.params, params))
    try:
        results = compiled(**values)
    except EinfuseError as problem:
        raise _in_context(problem, roots, where) from None
    if len(translation.outputs) == 1:
        results = (results,)
    delivered = []
    for position, lengths in zip(translation.root_outputs, groups):
        result = results[position]
        if lengths and max(lengths) > 1:        # .order(b, (h, h2)): flatten, a view
            shape, at = [], 0
            for n in lengths:
                size = 1
                for axis in range(at, at + n):
                    size *= int(result.shape[axis])
                shape.append(size)
                at += n
            result = result.reshape(tuple(shape))
        delivered.append(result)
    return delivered


def _in_context(problem: EinfuseError, roots, where) -> EinfuseError:
    """The program's error, saying which named expression's program it comes from."""
    lines = at_lines(*[node.line for node, _ in roots], where)
    raised = copy.copy(problem)
    raised.message = problem.message + " (in the program a named expression spells; a " \
        "dimension without a size needs dim.size = n)" * _about_ranges(problem) + \
        (f"\n  named expression{lines}" if lines else "")
    raised.args = (raised.message,)
    return raised


def _about_ranges(problem) -> bool:
    return type(problem).__name__ == "RangeError" and "infer" in problem.message


def _single_order(node: Named, where, what: str):
    named_dims = [d for d in node.dims if not isinstance(d, Slot)]
    if len(node.dims) > 1:
        raise error(IndexRuleError, f"{what} of a named expression with dimensions "
                    f"{', '.join(d.name if not isinstance(d, Slot) else ':' for d in node.dims)}"
                    f": a set has no order; give it with .order("
                    f"{', '.join(d.name for d in named_dims)})", where)
    return tuple(named_dims)


def to_numpy(node: Named, dtype, where):
    import numpy as np
    value = materialise([(node, _single_order(node, where, "np.asarray"))], {}, where)[0]
    if node.framework is not None and node.framework[0] == "torch":
        if value.requires_grad:
            raise error(EinfuseTypeError, "np.asarray would drop the gradient of a torch "
                        "expression that requires grad; use .order(...) (a tensor) or "
                        ".detach() its inputs", where)
        value = value.detach().cpu().numpy()
    elif node.framework is not None and node.framework[0] == "jax":
        try:
            value = np.asarray(value)
        except Exception as problem:       # a tracer under jax.jit has no values yet
            raise error(EinfuseTypeError, f"np.asarray of a traced JAX expression "
                        f"({type(problem).__name__}); use jnp.asarray(expr) or "
                        ".order(...) inside a traced function", where) from None
    return np.asarray(value, dtype=dtype)


def to_jax(node: Named, where):
    value = materialise([(node, _single_order(node, where, "jnp.asarray"))], {}, where)[0]
    if node.framework is None or node.framework[0] != "jax":
        import jax.numpy as jnp
        return jnp.asarray(to_numpy(node, None, where) if node.framework and
                           node.framework[0] == "torch" else value)
    return value


def dlpack(node: Named, where):
    """The materialised array a DLPack consumer (torch.as_tensor, np.from_dlpack) reads:
    kept between __dlpack_device__ and __dlpack__, then dropped."""
    if getattr(node, "_value", None) is None:
        value = materialise([(node, _single_order(node, where, "torch.as_tensor"))], {},
                            where)[0]
        if getattr(value, "requires_grad", False):
            raise error(EinfuseTypeError, "converting a torch expression that requires grad "
                        "would drop its gradient; use .order(...)", where)
        node._value = value
    return node._value


def evaluate(*requests, **options):
    """``ef.evaluate((e1, i, j), (e2, k), ...)``: several named expressions, each with
    its order, run as one program (shared subexpressions computed once).  A bare
    expression of at most one dimension needs no order.  One request gives its array,
    several a tuple."""
    where = named_module.caller_line()
    if not requests:
        raise error(EinfuseTypeError, "ef.evaluate takes named expressions, each as "
                    "(expr, dims...)", where)
    pairs = []
    for request in requests:
        if isinstance(request, (Dim, Affine)):       # index values: ef.evaluate(2*i + 1)
            request = named_module.as_named(request, where)
        if isinstance(request, tuple) and request and isinstance(request[0], (Dim, Affine)):
            request = (named_module.as_named(request[0], where),) + request[1:]
        if isinstance(request, Named):
            pairs.append((request, _single_order(request, where, "ef.evaluate")))
        elif isinstance(request, tuple) and request and isinstance(request[0], Named):
            pairs.append((request[0], request[1:]))
        else:
            raise error(EinfuseTypeError, "ef.evaluate takes named expressions as "
                        "(expr, dims...) tuples (the order of the result's axes), not "
                        f"{type(request).__name__}", where)
    results = materialise(pairs, options, where)
    return results[0] if len(results) == 1 else tuple(results)


def describe(node: Named) -> str:
    """repr: the dimensions with their sizes and the statement the expression stands
    for."""
    order = tuple(d for d in node.dims if not isinstance(d, Slot))
    try:
        translation = translate([(node, order)])[0].translation
        text, shifted = translation.text, translation.shifted
    except EinfuseError as problem:
        text, shifted = f"(cannot be spelled: {problem.message.splitlines()[0]})", ()
    sizes = []
    for d in node.dims:       # a shifted read may narrow a range (the notation's rule)
        entry = node.info.get(d.name)
        size = entry.use.size if entry is not None and entry.use is not None else "?"
        sizes.append(f"{d.name}{'<=' if d.name in shifted and size != '?' else '='}{size}")
    framework = node.framework[0] if node.framework else "no arrays"
    body = "\n    ".join(text.splitlines())
    return f"<named expression over ({', '.join(sizes) or 'no dimensions'}) ({framework}):" \
           f"\n    {body}>"


class NamedExplanation:
    """``ef.explain(expr)``: the program's explanation (its statements first), then which
    array and number each name of the program stands for."""

    def __init__(self, explanation, legend, translation):
        self.explanation, self.legend = explanation, legend
        self.program = translation.text          # the program the expression spells
        self.statements = tuple(translation.text.splitlines())

    def __getattr__(self, name):
        return getattr(self.explanation, name)

    def page(self):
        """The picture of the program the expression spells, with its names
        (docs/pictures.md)."""
        return named_page(self.explanation, self.legend)

    def _repr_html_(self) -> str:
        return self.page().fragment()

    def save(self, path: str) -> None:
        save_page(self.page(), path)

    def __str__(self) -> str:
        return str(self.explanation) + "\n\nNames in the program\n" + \
            "\n".join("  " + line for line in self.legend)


def explain_named(request, args, options, explain):
    """``ef.explain(expr, ...)``, ``ef.explain((expr, i, j), ...)`` or several such
    requests (as ``ef.evaluate`` takes them): explain the program they spell;
    ``shard=`` by dimension (objects or names)."""
    where = named_module.caller_line()
    pairs = []
    for item in (request,) + tuple(args):
        if isinstance(item, tuple) and item and isinstance(item[0], Named):
            pairs.append((item[0], item[1:]))
        elif isinstance(item, Named):
            pairs.append((item, tuple(d for d in item.dims if not isinstance(d, Slot))))
        else:
            raise error(EinfuseTypeError, "ef.explain of a named expression takes more named "
                        "expressions ((expr, dims...) as ef.evaluate does), not "
                        f"{type(item).__name__}: the arrays are in the expression", where)
    for option in ("ranges", "outputs", "shapes"):
        if options.pop(option, None) is not None:
            raise error(OptionError, f"ef.explain of a named expression takes no {option}=: "
                        "the expression gives its arrays, sizes and result", where)
    unknown = [k for k in options if k not in OPTIONS + EXPLAIN_OPTIONS]
    if unknown:
        raise unexpected_keywords("explain() of a named expression", unknown,
                                  OPTIONS + EXPLAIN_OPTIONS)
    passed = {k: v for k, v in options.items() if k in OPTIONS and v is not None}
    entry, found, roots, _, ranges = translate(pairs, passed, where, "explain()")
    translation = entry.translation
    values = dict(zip(translation.tensors, found.arrays))
    values.update(zip(translation.params, found.params))
    extra = {k: options[k] for k in EXPLAIN_OPTIONS if options.get(k) not in (None, False)}
    if "shard" in extra and isinstance(extra["shard"], dict):
        extra["shard"] = _shard_by_index(extra["shard"], translation, where)
    if len(translation.statements) > 1:
        extra["outputs"] = translation.outputs
    try:
        explanation = explain(translation.text, ranges=dict(ranges) or None, arrays=values,
                              **passed, **extra)
    except EinfuseError as problem:
        raise _in_context(problem, roots, where) from None
    legend = []
    for name, wrapped in zip(translation.tensors, found.wrapped):
        legend.append(f"{name}: {wrapped.kind()}"
                      + (f", wrapped at {at_lines(wrapped.where).strip()[3:]}"
                         if wrapped.where else ""))
    for name, value in zip(translation.params, found.params):
        legend.append(f"{name} = {value!r} (a Python {type(value).__name__}, passed as a scalar "
                      "parameter: another value is the same program)")
    renamed = [f"{alias} is dimension {dim}" for dim, names in
               translation.index_names.items() for alias in names if alias != dim]
    if renamed:
        legend.append("renamed indices (a reduction's own index, or a reserved word): " +
                      "; ".join(renamed))
    return NamedExplanation(explanation, legend, translation)


def _placement_key(placement, where):
    """``mesh=``/``shard=`` as a key of the compiled programs: a JAX mesh is hashable; a
    dict of axis sizes (and a shard dict) is keyed by its items."""
    def frozen(value):
        if isinstance(value, dict):
            return ("dict",) + tuple(sorted((str(k), frozen(v)) for k, v in value.items()))
        if isinstance(value, list):
            return ("list",) + tuple(frozen(v) for v in value)
        return value
    key = tuple((name, frozen(value)) for name, value in sorted(placement.items()))
    try:
        hash(key)
    except TypeError:
        raise error(OptionError, f"mesh= takes a jax.sharding.Mesh or a dict of axis sizes, "
                    f"and shard= a dict of dimension -> mesh axis, 'auto' or None, not "
                    f"{placement!r}", where) from None
    return key


def _shard_by_index(shard, translation, where):
    """``shard=`` by dimension as ``shard=`` by the program's index names.  A dimension
    is its own index and the indices of the reductions renamed after it (``T_1``, the
    softmax's maximum over ``T``); a renamed index that shares a statement with one
    already split over the axes stays whole there, since one mesh axis can split only
    one index of a statement (that reduction then reads its operand gathered)."""
    mapped = {}
    indices_of = [_statement_indices(s) for s in translation.statements]
    for key, axis in shard.items():
        name = key.name if isinstance(key, Dim) else key
        if not isinstance(name, str) or name not in translation.index_names:
            raise error(OptionError, f"shard= names {name!r}, which is not a dimension of "
                        f"the expression (its dimensions are "
                        f"{', '.join(translation.index_names)})", where)
        aliases = sorted(translation.index_names[name], key=lambda alias: alias != name)
        taken = []
        for index in aliases:
            if any(index in found and any(t in found for t in taken) for found in indices_of):
                continue
            mapped[index] = axis
            taken.append(index)
    return mapped


def _statement_indices(statement) -> frozenset:
    found = set(statement.output_indices)
    for node in statement.rhs.walk():
        if isinstance(node, Reduce):
            found.update(node.indices)
        elif isinstance(node, IndexValue):
            found.add(node.name)
        elif isinstance(node, Access):
            for sub in node.indices:
                found.update(sub.index_names)
    return frozenset(found)


# -- other libraries' entry points ---------------------------------------------------------

_TORCH_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "true_divide": "/",
                 "floor_divide": "//", "remainder": "%", "pow": "**", "lt": "<", "le": "<=",
                 "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "bitwise_and": "&",
                 "logical_and": "&", "bitwise_or": "|", "logical_or": "|", "and": "&",
                 "or": "|", "truediv": "/", "floordiv": "//", "mod": "%"}
_TORCH_FUNCTIONS = {"arctan2": "atan2", "absolute": "abs"}


def torch_function(func, args, kwargs, where):
    """A torch function meeting a named expression: indexing a plain tensor by
    dimensions or gathers, the notation's functions, and operators with a 0-d tensor;
    anything else is an error that says to materialise first."""
    name = getattr(func, "__name__", str(func))
    if name == "__getitem__" and len(args) == 2 and not isinstance(args[0], Named):
        return read(wrap(args[0]), args[1], where)
    bare = name.strip("_")
    if name in ("as_tensor", "asarray", "tensor") and args and isinstance(args[0], Named):
        import torch
        value = materialise([(args[0], _single_order(args[0], where, f"torch.{name}"))],
                            {}, where)[0]
        return torch.as_tensor(value, **kwargs)
    if bare in _TORCH_BINARY and len(args) == 2 and not kwargs:
        return named_module.apply_op("bin", (_TORCH_BINARY[bare],), args, where)
    function = _TORCH_FUNCTIONS.get(bare, bare)
    if function in FUNCTIONS and not kwargs:
        return FUNCTIONS[function](*args)
    if bare == "softmax" and args and isinstance(args[0], Named):
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        return args[0].softmax(dim)
    raise error(EinfuseTypeError, f"torch's {name} does not take a named expression; "
                "materialise it first with .order(...), or use the expression's own "
                "operators and methods", where)


_NUMPY_UFUNCS = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/",
                 "true_divide": "/", "floor_divide": "//", "remainder": "%", "power": "**",
                 "less": "<", "less_equal": "<=", "greater": ">", "greater_equal": ">=",
                 "equal": "==", "not_equal": "!=", "logical_and": "&", "logical_or": "|"}
_NUMPY_FUNCTIONS = {"absolute": "abs", "arctan2": "atan2", "maximum": "maximum",
                    "minimum": "minimum", "fabs": "abs"}


def array_ufunc(ufunc, method, inputs, kwargs, where):
    """NumPy's ufuncs on named expressions: the notation's operators and functions."""
    name = ufunc.__name__
    if method == "__call__" and not kwargs:
        if name in _NUMPY_UFUNCS and len(inputs) == 2:
            return named_module.apply_op("bin", (_NUMPY_UFUNCS[name],), inputs, where)
        if name == "negative" and len(inputs) == 1:
            return -inputs[0]
        function = _NUMPY_FUNCTIONS.get(name, name)
        if function in FUNCTIONS:
            return FUNCTIONS[function](*inputs)
    raise error(EinfuseTypeError, f"numpy.{name} ({method}) does not take a named "
                "expression; materialise it first with .order(...), or use the "
                "expression's own operators and methods", where)


def install() -> None:
    named_module.hooks.update(materialise=materialise, describe=describe,
                              torch_function=torch_function, array_ufunc=array_ufunc,
                              to_numpy=to_numpy, to_jax=to_jax, dlpack=dlpack,
                              explain=explain_named)


install()

