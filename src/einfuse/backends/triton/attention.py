"""Recognised attention (rewrite/online_softmax.py) as one Triton kernel: the forward of
FlashAttention-2 (its backward: attention_backward.py).  One program per block of query rows of one batch element; it streams
the key and value blocks with a running max, a running denominator and a rescaled
accumulator (the softmax-weighted-sum monoid), so nothing N x N exists.

* scores in the log2 domain: log2(e) is folded into the scale, weights are ``exp2``;
* a causal mask (``j <= i`` or ``j < i``), or any band ``lower <= j - i <= upper`` (a
  window), never visits key blocks outside it and masks only the blocks that straddle
  its edges (and the key tail); rows of the last blocks are launched first, so the
  longest programs start earliest;
* the scores' additive terms (a padding mask, a bias, ALiBi's slopes: attention_terms.py)
  are read by the kernel per block through their strides, after the scale;
* float16/bfloat16 operands go to ``tl.dot`` as they are (float32 accumulation; the
  weights are rounded to the input dtype for the weights x value dot, as flash kernels
  do); float32 dots are IEEE-exact (``input_precision="ieee"``); the result is stored in
  the input dtype;
* the operands are read through their strides (any axis order the recogniser hands
  over: no transposing copies), two batch axes addressed directly;
* every row whose visible scores are all -inf gives NaN, as the statements' exp(-inf -
  -inf) does, and a -inf block seen first does not poison the rows that see finite
  scores later;
* a value (V) holding inf or NaN gives what the statements give (0 * inf = NaN at a
  key a row weighs 0, a masked one too): the kernel finds it (in its accumulator, and
  under a causal mask in the keys past the ones it weighed, read as bits: their
  exponent fields, an extra read of those value rows per block of query rows, from L2,
  not yet timed on a GPU) and weighs every key again for that block of rows, so the
  host never waits for a check.

Runs on CUDA tensors, and on the CPU under ``TRITON_INTERPRET=1`` (where the bfloat16
dot is computed in float32: the interpreter's bfloat16 dot is wrong)."""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import numpy as np

import triton

from ...schedule.attention_blocks import (INTERPRETED_CONFIG,  # noqa: F401 (re-exported)
                                          AttentionConfig, attention_blocks,
                                          candidates)
from .attention_kernel import EXPONENT_BITS, attention_forward
from .attention_terms import KernelTerms, plain_terms, resolve
from .launch import PreparedLaunch

MAX_HEAD_DIM = 128      # D and E up to this (padded to a power of two, at least 16)
_GRID_AXIS_LIMIT = 65535
_INT32_MAX = 2 ** 31 - 1
# (grid, extents, config, modes, dtype, device) -> the kernel's prepared launch
_launchers: dict = {}


# The launch blocks are the schedule's (schedule/attention_blocks.py); the names stay
# here for the kernel's callers (tools/gpu_attention.py sweeps ``candidates``).
Config = AttentionConfig
_forced: Optional[Config] = None


@contextlib.contextmanager
def forced_config(config: Optional[Config]) -> Iterator[None]:
    """Every launch inside the block uses ``config`` (None: the default choice) -- for
    sweeping the candidates on a GPU (tools/gpu_attention.py)."""
    global _forced
    if config is not None and not isinstance(config, Config):
        from ...errors import OptionError
        raise OptionError(f"forced_config takes a Config or None, not "
                          f"{type(config).__name__}")
    previous, _forced = _forced, config
    try:
        yield
    finally:
        _forced = previous


def choose_config(dtype_name: str, head_dim: int, interpreted: bool) -> Config:
    """The launch blocks the schedule decided for this call signature."""
    return attention_blocks(dtype_name, head_dim, interpreted, _forced).config


def padded_block(extent: int) -> int:
    """The block holding ``extent`` features: a power of two, 16 at least (tl.dot's)."""
    return max(16, triton.next_power_of_2(extent))


def unsupported(dtype_name: str, dot: int, features: int) -> Optional[str]:
    """Why the kernel does not take this call (the statements run instead), or None."""
    if dtype_name not in ("float16", "bfloat16", "float32"):
        return f"{dtype_name} (the kernel takes float16, bfloat16 and float32)"
    if dot > MAX_HEAD_DIM or features > MAX_HEAD_DIM:
        return (f"a head dimension of {max(dot, features)} (the kernel takes up to "
                f"{MAX_HEAD_DIM})")
    return None


@dataclass(frozen=True)
class Operand:
    """A (B1, B2, rows, columns) strided view's address: its tensor and four strides."""
    tensor: object
    strides: Tuple[int, int, int, int]


def fits(shape, strides) -> bool:
    """Whether offsets inside one batch element fit in int32 (the kernel's row and column
    arithmetic) and the batch axes fit on the launch grid."""
    inner = sum((extent - 1) * abs(stride) for extent, stride in zip(shape[2:], strides[2:]))
    return inner <= _INT32_MAX and shape[0] <= _GRID_AXIS_LIMIT and \
        shape[1] <= _GRID_AXIS_LIMIT


def launch(query: Operand, key: Operand, value: Operand, out: Operand,
           batch: Tuple[int, int], rows: int, keys: int, dot: int, features: int,
           score_scale: float, mask: int, normalised: bool, interpreted: bool,
           terms: Optional[KernelTerms] = None, lse=None, flags=None) -> Config:
    """Run the kernel: ``out`` (B1, B2, rows, features) from query (B1, B2, rows, dot),
    key (B1, B2, keys, dot) and value (B1, B2, keys, features); ``score_scale`` is the
    scores' factor with log2(e) folded in; ``mask`` 0 none, 1 ``j <= i``, 2 ``j < i``
    where ``terms`` (backends/triton/attention_terms.py: the scores' terms and band) is
    None; ``lse``, a contiguous (B1, B2, rows) float32 tensor, receives each row's
    log2-sum-exp2 of its scores (the backward's), and ``flags`` with it, a contiguous
    int32 tensor of one element per program (:func:`flag_count`), each program's 1
    where a value of its batch element holds inf or NaN or its sums overflowed (the
    backward reads them, on the device, with its own checks).  Returns the
    configuration it ran with."""
    dtype_name = str(query.tensor.dtype).rsplit(".", 1)[-1]
    config = choose_config(dtype_name, max(dot, features), interpreted)
    if terms is None:
        terms = plain_terms(mask)
    grid = (triton.cdiv(rows, config.block_m), batch[0], batch[1])
    device = out.tensor.device
    signature = (grid, dot, features, config, terms.signature, lse is not None, normalised,
                 dtype_name, interpreted, device)
    launcher = _launchers.get(signature)
    if launcher is None:
        launcher = PreparedLaunch(
            attention_forward, grid, dict(num_warps=config.warps, num_stages=config.stages),
            dict(DOT=dot, FEATURES=features, BLOCK_D=padded_block(dot),
                 BLOCK_E=padded_block(features), BLOCK_M=config.block_m,
                 BLOCK_N=config.block_n, NORMALISED=normalised, STORE_LSE=lse is not None,
                 EXACT=dtype_name == "float32",
                 UPCAST=interpreted and dtype_name == "bfloat16",
                 EXPONENT=EXPONENT_BITS[dtype_name], **terms.constants),
            device.index if device.type == "cuda" else None)
        if len(_launchers) >= _PLANS_KEPT:
            _launchers.clear()
        _launchers[signature] = launcher
    # (an unused slot's pointer: an operand the kernel never reads there)
    slots = [query.tensor if a is None else a for a in terms.tensor_args + terms.index_args]
    lse_strides = (lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
    launcher(query.tensor, key.tensor, value.tensor, out.tensor,
             out.tensor if lse is None else lse, out.tensor if flags is None else flags,
             score_scale, *query.strides, *key.strides, *value.strides, *out.strides,
             *lse_strides, rows, keys, terms.lower, terms.upper, *slots)
    return config


def flag_count(rows: int, batch: Tuple[int, int], interpreted: bool, dtype_name: str,
               head_dim: int) -> int:
    """How many programs the launch for these extents has (one flag each)."""
    config = choose_config(dtype_name, head_dim, interpreted)
    return triton.cdiv(rows, config.block_m) * batch[0] * batch[1]


# -- the call: which route, the operands' strided views, the launch -----------------------

class AttentionTarget(enum.Enum):
    """Where the kernel runs for a call."""
    GPU = "the GPU"                                   # CUDA tensors, or copied there
    INTERPRETER = "the CPU (TRITON_INTERPRET=1)"      # backend='triton' under the interpreter


def route(options, named, operand_names) -> Optional[AttentionTarget]:
    """The route of a call whose query, key and value are ``named[operand_names]``, or
    None where it is not the kernel's: torch CUDA tensors (backend 'auto' or 'triton'),
    or NumPy arrays / CPU tensors with backend='triton' (on the GPU, or on the CPU under
    the interpreter).  Only types and devices are read."""
    if options.backend not in ("auto", "triton") or options.pad is not None or \
            options.ranges or options.dtype is not None:
        return None
    from .backend import interpreted
    arrays = [named.get(n) for n in operand_names]
    devices = set()
    for array in arrays:
        if type(array) is np.ndarray:
            devices.add("cpu")
        elif type(array).__module__.startswith("torch") and \
                type(array).__name__ in ("Tensor", "Parameter"):
            devices.add(str(array.device))
        else:
            return None
    if len(devices) != 1:
        return None
    device = devices.pop()
    if device.startswith("cuda"):
        return AttentionTarget.GPU if not interpreted() else None
    if device != "cpu" or options.backend != "triton":
        return None
    if interpreted():
        return AttentionTarget.INTERPRETER
    import torch
    return AttentionTarget.GPU if torch.cuda.is_available() else None


def run(attention, named, scale_of, route_taken: AttentionTarget,
        lse: Optional[list] = None):
    """The attention's output for this call (a torch tensor for torch callers, a NumPy
    array for NumPy callers), or None where the statements must run: not one supported
    float dtype, extents that disagree or are empty, offsets past int32.
    ``scale_of(query)`` gives the scale (a float), or None where the statements must
    judge it.  (A value holding inf or NaN is the kernel's own case: where it finds one
    it weighs every key as the statements do, attention_forward; nothing is checked on
    the host.)  ``lse``: a list that receives, for the backward, the rows'
    log2-sum-exp2, the canonical views, the terms and the programs' flags (a value
    holding inf or NaN: a device tensor, never read here)."""
    import torch
    names = (attention.query, attention.key, attention.value)
    given = [named[n] for n in names]
    numpy_caller = type(given[0]) is np.ndarray
    tensors = []
    for array in given:
        if type(array) is np.ndarray:
            if array.dtype not in (np.float16, np.float32):
                return None
            array = torch.from_numpy(np.array(array, order="C"))   # (a writable copy)
        elif array.layout != torch.strided or array.is_nested or \
                torch._C._functorch.is_functorch_wrapped_tensor(array):
            return None
        tensors.append(array.detach())
    dtype = tensors[0].dtype
    if any(t.dtype != dtype for t in tensors):
        return None
    from ...rewrite.attention_layout import shape_extents
    extents = shape_extents(attention, tensors)
    if extents is None:
        return None
    dot, features = extents[attention.dot_index], extents[attention.feature]
    if unsupported(str(dtype).rsplit(".", 1)[-1], dot, features) is not None:
        return None
    scale = scale_of(tensors[0])
    if scale is None:
        return None
    score_scale = _score_scale(attention, scale)
    if score_scale is None:
        return None
    if route_taken is AttentionTarget.GPU and tensors[0].device.type == "cpu":
        tensors = [t.cuda() for t in tensors]
    terms = None
    if not attention.plain:
        terms = resolve(attention, named, tensors[0], extents, batch_axes(attention))
        if isinstance(terms, str):
            return None
    out = _launch_call(attention, tensors, extents, score_scale,
                       route_taken is AttentionTarget.INTERPRETER, terms, lse)
    if out is None:
        return None
    if numpy_caller:
        return out.cpu().numpy()
    return out if given[0].device == out.device else out.to(given[0].device)


def _score_scale(attention, scale: float) -> Optional[float]:
    """The scores' factor with log2(e) folded in, or None where folding it would
    overflow or underflow float32 where the scale itself does not."""
    from ...rewrite.online_softmax import ScaleKind
    with np.errstate(all="ignore"):
        value = np.float32(scale)
        folded = value * _LOG2E if attention.scale is ScaleKind.MULTIPLY else \
            _LOG2E / value if attention.scale is ScaleKind.DIVIDE else _LOG2E
    if np.isfinite(value) and value != 0 and (not np.isfinite(folded) or folded == 0):
        return None
    return float(folded)


_LOG2E = np.float32(1.4426950408889634)


def folded_scale(attention, scale: float) -> Optional[float]:
    """The kernel's scale (log2(e) folded in) for the call's scale."""
    return _score_scale(attention, scale)


def batch_axes(attention) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """The batch indices the launch grid's two batch axes stand for (_canonical_view:
    all but the last merged into the first)."""
    batch = attention.batch
    if len(batch) <= 1:
        return (), tuple(batch)
    return tuple(batch[:-1]), (batch[-1],)


def terms_reason(attention, named) -> Optional[str]:
    """Why the kernel does not take this call's scores' terms or band (for explain), or
    None where it does (or the scores are plain)."""
    if attention.plain:
        return None
    import torch
    query = named.get(attention.query)
    if type(query) is np.ndarray:
        query = torch.from_numpy(np.ascontiguousarray(query))
    if not isinstance(query, torch.Tensor):
        return None
    from ...rewrite.attention_layout import shape_extents
    arrays = [named.get(n) for n in (attention.query, attention.key, attention.value)]
    if not all(hasattr(a, "shape") and hasattr(a, "ndim") for a in arrays):
        return None
    extents = shape_extents(attention, arrays)
    if extents is None:
        return None
    found = resolve(attention, named, query, extents, batch_axes(attention))
    return found if isinstance(found, str) else None


def _canonical_view(tensor, indices, order, batch_rank: int):
    """``tensor`` with its axes in ``order`` as (B1, B2, rows, columns) without copying
    where the batch axes allow (more than two batch axes are merged: a copy where their
    strides do not allow a view)."""
    moved = tensor.permute([indices.index(n) for n in order])
    if batch_rank == 0:
        return moved[None, None]
    if batch_rank == 1:
        return moved[None]
    return moved.flatten(0, batch_rank - 2)


@dataclass(frozen=True)
class _Plan:
    """How a call of one signature (the attention, each operand's shape and strides,
    the dtype) launches when no operand needs a copy: the strides of the canonical
    views (which start at the operands' own first elements, so the operands are passed
    as they are), the output's shape, the launch's extents."""
    strides: Tuple[Tuple[int, int, int, int], ...]     # query, key, value, output
    out_shape: Tuple[int, ...]
    batch: Tuple[int, int]
    extents: Tuple[int, int, int, int]     # rows, keys, dot, features


_plans: dict = {}
_PLANS_KEPT = 256


def _direct_plan(attention, tensors, extents) -> Optional[_Plan]:
    """The call's plan (cached by signature), or None where an operand's batch axes do
    not merge into a view, the output's would not, or offsets do not fit."""
    import torch
    key = (attention, tensors[0].dtype) + tuple(
        (tuple(t.shape), t.stride()) for t in tensors)
    if key in _plans:
        return _plans[key]
    from ...rewrite.attention_layout import operand_layouts
    batch_rank = len(attention.batch)
    views = [_canonical_view(t, indices, order, batch_rank)
             for t, (order, indices) in zip(tensors, operand_layouts(attention))]
    out_shape = tuple(extents[n] for n in attention.output_indices)
    out = torch.empty(out_shape, dtype=torch.int8, device="meta")
    out_view = _canonical_view(out, attention.output_indices,
                               attention.batch + (attention.row, attention.feature),
                               batch_rank)
    direct = all(v.data_ptr() == t.data_ptr() and v._base is not None
                 for v, t in zip(views, tensors)) and out_view._base is not None
    plan = None
    if direct and all(fits(v.shape, v.stride()) for v in views + [out_view]):
        q, k, v = views
        plan = _Plan(tuple(tuple(x.stride()) for x in views + [out_view]), out_shape,
                     tuple(q.shape[:2]), (q.shape[2], k.shape[2], q.shape[3], v.shape[3]))
    if len(_plans) >= _PLANS_KEPT:
        _plans.clear()
    _plans[key] = plan
    return plan


def _launch_call(attention, tensors, extents, score_scale: float, interpreted: bool,
                 terms: Optional[KernelTerms] = None, lse: Optional[list] = None):
    import torch
    from ...rewrite.online_softmax import MaskKind
    from ...rewrite.attention_layout import operand_layouts
    plan = _direct_plan(attention, tensors, extents) if lse is None else None
    if plan is not None:
        return _launch(attention, plan, tensors, score_scale, interpreted, terms)
    batch_rank = len(attention.batch)
    views = [_canonical_view(t, indices, order, batch_rank)
             for t, (order, indices) in zip(tensors, operand_layouts(attention))]
    out_order = attention.batch + (attention.row, attention.feature)
    out = torch.empty([extents[n] for n in attention.output_indices], dtype=tensors[0].dtype,
                      device=tensors[0].device)
    out_view = _canonical_view(out, attention.output_indices, out_order, batch_rank)
    staged = out_view.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
    if staged:       # the output's batch axes do not merge: write canonical, copy once
        out_view = _canonical_view(torch.empty([extents[n] for n in out_order],
                                               dtype=out.dtype, device=out.device),
                                   out_order, out_order, batch_rank)
    if not all(fits(v.shape, v.stride()) for v in views + [out_view]):
        return None
    q, k, v = views
    mask = {MaskKind.NONE: 0, MaskKind.CAUSAL: 1, MaskKind.STRICT_CAUSAL: 2,
            MaskKind.BAND: 0}[attention.mask]
    rows_lse = flags = None
    if lse is not None:
        rows_lse = torch.empty(tuple(q.shape[:3]), dtype=torch.float32, device=q.device)
        flags = torch.empty(flag_count(q.shape[2], tuple(q.shape[:2]), interpreted,
                                       str(q.dtype).rsplit(".", 1)[-1],
                                       max(q.shape[3], v.shape[3])),
                            dtype=torch.int32, device=q.device)
    _launched(out.device, *(Operand(x, tuple(x.stride())) for x in (q, k, v, out_view)),
              tuple(q.shape[:2]), q.shape[2], k.shape[2], q.shape[3], v.shape[3],
              score_scale, mask, attention.normalised, interpreted, terms, rows_lse, flags)
    if lse is not None:
        lse.extend([rows_lse, (q, k, v, out_view), terms or plain_terms(mask), flags])
    if staged:
        shaped = out_view.reshape([extents[n] for n in out_order])
        out.copy_(shaped.permute([out_order.index(n) for n in attention.output_indices]))
    return out


_MASK_MODES = {"none": 0, "j <= i": 1, "j < i": 2}     # MaskKind's values


def _launch(attention, plan: _Plan, tensors, score_scale: float, interpreted: bool,
            terms: Optional[KernelTerms] = None):
    """The launch of a cached plan: the operands as they are, with the plan's strides."""
    import torch
    out = torch.empty(plan.out_shape, dtype=tensors[0].dtype, device=tensors[0].device)
    _launched(out.device, *(Operand(x, strides) for x, strides in zip(
        (tensors[0], tensors[1], tensors[2], out), plan.strides)),
        plan.batch, *plan.extents, score_scale, _MASK_MODES.get(attention.mask.value, 0),
        attention.normalised, interpreted, terms)
    return out


def _launched(device, *arguments) -> None:
    """``launch(*arguments)`` on ``device``.  A failure of the kernel (its compilation,
    resources) is raised as the kernel's."""
    import torch
    from ...errors import BackendError
    on_gpu = device.type == "cuda"
    try:
        with torch.cuda.device(device) if on_gpu and \
                device.index != torch.cuda.current_device() else contextlib.nullcontext():
            launch(*arguments)
    except Exception as error:     # compilation or resources: the kernel's fault
        raise BackendError(f"the fused Triton attention kernel failed: "
                           f"{type(error).__name__}: {error}") from error
