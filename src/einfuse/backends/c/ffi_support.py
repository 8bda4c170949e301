"""The C side of einfuse's XLA FFI handlers (runtime/jax_ffi.py): one support library,
written against XLA's plain-C FFI API (``xla/ffi/api/c_api.h``, shipped with jaxlib),
that every einfuse kernel library built for XLA calls into through a small stub
(:func:`kernel_stub`).

What the handler does with a call frame, in order:

1. answers XLA's metadata query (the API version of these headers) and ignores every
   stage but EXECUTE;
2. validates what XLA passes against the plan made at lowering time (three
   attributes: ``layout``, ``ints``, ``fills``): the number of buffers, each one's
   dtype, rank and dims, and the result's; a mismatch is an XLA FFI error naming it;
3. points the kernel's buffer slots at XLA's buffers, converting (into scratch) only a
   slot whose dtype is not the kernel's (int32 index arrays and int64 kernels when
   jax_enable_x64 is off); the output is written straight into XLA's result buffer
   unless it too must be narrowed;
4. reads the scalar parameters from their 0-d buffers (values known only at run time);
5. runs the kernels -- those planned for gathers known to be in range when the index
   arrays' extremes show it (the ``verify`` attribute), else those that test each
   gathered value; when a gather flagged an index out of range (bounds='check' /
   'promise'), asks the reporter that einfuse installed for einfuse's own message (the
   NumPy reference finds the first offending value) and returns it as the error.

Threads: only one einfuse kernel called from XLA runs a parallel region at a time;
another one that starts meanwhile (XLA runs independent ops on several threads of its
pool) runs on its calling thread, so kernels never multiply their OpenMP teams.

The ``layout`` attribute (int64s): token, threads, operand count, slot count, parameter
count; per operand: XLA dtype, rank, dims; per slot: operand, wanted dtype; per
parameter: operand; then the result's XLA dtype, the kernel output's dtype, rank, dims.
"""

from __future__ import annotations

import re

# XLA_FFI_DataType codes of the dtypes the handler converts between (c_api.h).
XLA_DTYPES = {"bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6,
              "uint16": 7, "uint32": 8, "uint64": 9, "float32": 11, "float64": 12}

_PATH = re.compile(r"[A-Za-z0-9_./+~-]+\Z")

# What both FFI handler libraries (this one and backends/c/jit_ffi.py's) begin with: the
# headers, an XLA error from a message, and the answer to XLA's metadata query and to the
# stages before execution.
FFI_PRELUDE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include "@HEADER@"
/* jaxlib @VERSION@ */

static XLA_FFI_Error *ef_error(const XLA_FFI_Api *api, XLA_FFI_Error_Code code,
                               const char *message) {
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = code;
  return api->XLA_FFI_Error_Create(&args);
}

/* 1 when the call is XLA's metadata query (answered: this API version, no traits) or a
   stage before execution: the handler then returns no error and does nothing else */
static int ef_not_executing(XLA_FFI_CallFrame *frame) {
  if (frame->extension_start != 0 &&
      frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)frame->extension_start;
    ext->metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    ext->metadata->api_version.extension_start = 0;
    ext->metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    ext->metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    ext->metadata->traits = 0;
    return 1;
  }
  return frame->stage != XLA_FFI_ExecutionStage_EXECUTE;
}
"""

SUPPORT_SOURCE = r"""
typedef void (*ef_kernel_fn)(void **, const int64_t *, const double *, const int64_t *,
                             const double *, int, int32_t *);
typedef int64_t (*ef_reporter)(int64_t token, void **args, int64_t count, char *message,
                               int64_t capacity);

static ef_reporter ef_report = 0;
static int ef_busy = 0;

/* the flag, lent to the ef.jit handler (backends/c/jit_ffi.py): one parallel region at
   a time among all the einfuse kernels that XLA calls */
int *einfuse_ffi_busy_flag(void) { return &ef_busy; }

void einfuse_ffi_set_reporter(void *fn) {
  __atomic_store_n(&ef_report, (ef_reporter)fn, __ATOMIC_RELEASE);
}

static const XLA_FFI_Array *ef_array(const XLA_FFI_Attrs *attrs, const char *name,
                                     XLA_FFI_DataType dtype) {
  size_t len = strlen(name);
  for (int64_t k = 0; k < attrs->size; ++k) {
    const XLA_FFI_ByteSpan *key = attrs->names[k];
    if (key->len == len && memcmp(key->ptr, name, len) == 0 &&
        attrs->types[k] == XLA_FFI_AttrType_ARRAY) {
      const XLA_FFI_Array *array = (const XLA_FFI_Array *)attrs->attrs[k];
      return array->dtype == dtype ? array : 0;
    }
  }
  return 0;
}

static int ef_is_float(int64_t t) { return t == XLA_FFI_DataType_F32 || t == XLA_FFI_DataType_F64; }
static int ef_is_unsigned(int64_t t) {
  return t == XLA_FFI_DataType_PRED || t == XLA_FFI_DataType_U8 || t == XLA_FFI_DataType_U16 ||
         t == XLA_FFI_DataType_U32 || t == XLA_FFI_DataType_U64;
}
static size_t ef_size(int64_t t) {
  switch (t) {
    case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_S8: case XLA_FFI_DataType_U8: return 1;
    case XLA_FFI_DataType_S16: case XLA_FFI_DataType_U16: return 2;
    case XLA_FFI_DataType_S32: case XLA_FFI_DataType_U32: case XLA_FFI_DataType_F32: return 4;
    case XLA_FFI_DataType_S64: case XLA_FFI_DataType_U64: case XLA_FFI_DataType_F64: return 8;
    default: return 0;
  }
}
/* element i of an integer buffer, as int64 (uint64 keeps its bit pattern) */
static int64_t ef_int(int64_t t, const void *p, int64_t i) {
  switch (t) {
    case XLA_FFI_DataType_PRED: return ((const uint8_t *)p)[i] != 0;
    case XLA_FFI_DataType_S8: return ((const int8_t *)p)[i];
    case XLA_FFI_DataType_S16: return ((const int16_t *)p)[i];
    case XLA_FFI_DataType_S32: return ((const int32_t *)p)[i];
    case XLA_FFI_DataType_S64: return ((const int64_t *)p)[i];
    case XLA_FFI_DataType_U8: return ((const uint8_t *)p)[i];
    case XLA_FFI_DataType_U16: return ((const uint16_t *)p)[i];
    case XLA_FFI_DataType_U32: return ((const uint32_t *)p)[i];
    case XLA_FFI_DataType_U64: return (int64_t)((const uint64_t *)p)[i];
    default: return 0;
  }
}
static double ef_real(int64_t t, const void *p, int64_t i) {
  if (t == XLA_FFI_DataType_F32) return ((const float *)p)[i];
  if (t == XLA_FFI_DataType_F64) return ((const double *)p)[i];
  if (t == XLA_FFI_DataType_U64) return (double)((const uint64_t *)p)[i];
  return (double)ef_int(t, p, i);
}
/* dst[i] = src[i] converted as NumPy's astype does for these pairs (integers wrap,
   floats round to nearest); the plan only asks for integer -> anything and
   float -> float */
static void ef_convert(int64_t from, const void *src, int64_t to, void *dst, int64_t n) {
  int real = ef_is_float(from);
  for (int64_t i = 0; i < n; ++i) {
    switch (to) {
      case XLA_FFI_DataType_F32: ((float *)dst)[i] = (float)ef_real(from, src, i); break;
      case XLA_FFI_DataType_F64: ((double *)dst)[i] = ef_real(from, src, i); break;
      case XLA_FFI_DataType_PRED: ((uint8_t *)dst)[i] = real ? ef_real(from, src, i) != 0 : ef_int(from, src, i) != 0; break;
      case XLA_FFI_DataType_S8: ((int8_t *)dst)[i] = (int8_t)ef_int(from, src, i); break;
      case XLA_FFI_DataType_S16: ((int16_t *)dst)[i] = (int16_t)ef_int(from, src, i); break;
      case XLA_FFI_DataType_S32: ((int32_t *)dst)[i] = (int32_t)ef_int(from, src, i); break;
      case XLA_FFI_DataType_S64: ((int64_t *)dst)[i] = ef_int(from, src, i); break;
      case XLA_FFI_DataType_U8: ((uint8_t *)dst)[i] = (uint8_t)ef_int(from, src, i); break;
      case XLA_FFI_DataType_U16: ((uint16_t *)dst)[i] = (uint16_t)ef_int(from, src, i); break;
      case XLA_FFI_DataType_U32: ((uint32_t *)dst)[i] = (uint32_t)ef_int(from, src, i); break;
      case XLA_FFI_DataType_U64: ((uint64_t *)dst)[i] = (uint64_t)ef_int(from, src, i); break;
    }
  }
}

#define EF_MAX_SLOTS 64
#define EF_MAX_PARAMS 64

typedef struct { void *data[EF_MAX_SLOTS]; int owned[EF_MAX_SLOTS]; int n; } ef_scratch;
static void ef_free(ef_scratch *s) {
  for (int k = 0; k < s->n; ++k) if (s->owned[k]) free(s->data[k]);
}

/* whether the buffer matches (dtype, rank, dims) at layout[*at]; advances *at */
static int ef_matches(const XLA_FFI_Buffer *b, const int64_t *layout, size_t size,
                      size_t *at, int64_t *count) {
  if (*at + 2 > size) return 0;
  int64_t dtype = layout[*at], rank = layout[*at + 1];
  *at += 2;
  if (rank < 0 || *at + (size_t)rank > size) return 0;
  int ok = b->dtype == dtype && b->rank == rank;
  int64_t n = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (ok && b->dims[d] != layout[*at + d]) ok = 0;
    n *= layout[*at + d];
  }
  *at += rank;
  *count = n;
  return ok;
}

/* Whether every gathered subscript stays inside its axis for any value the index
   arrays hold (plan/gathers.py's gathers_in_range, on XLA's buffers): then the kernels
   planned for verified gathers (no per-element test, vectorised) may run.  The
   "verify" attribute: rule count; per rule: low, high (of the subscript's index part),
   axis length, gather count; per gather: operand, coefficient. */
static int ef_in_range(const XLA_FFI_Array *verify, const XLA_FFI_CallFrame *frame,
                       const int64_t *counts) {
  const int64_t *v = (const int64_t *)verify->data;
  size_t size = verify->size, at = 1;
  int64_t operands = frame->args.size;
  if (size < 1) return 0;
  int64_t lows[EF_MAX_SLOTS + EF_MAX_PARAMS], highs[EF_MAX_SLOTS + EF_MAX_PARAMS];
  signed char state[EF_MAX_SLOTS + EF_MAX_PARAMS];   /* 0 unknown, 1 known, 2 empty */
  memset(state, 0, sizeof state);
  for (int64_t r = 0; r < v[0]; ++r) {
    if (at + 4 > size) return 0;
    __int128 low = v[at], high = v[at + 1];
    int64_t length = v[at + 2], gathers = v[at + 3];
    at += 4;
    if (gathers < 0 || at + 2 * (size_t)gathers > size) return 0;
    int reads = 1;
    for (int64_t g = 0; g < gathers; ++g, at += 2) {
      int64_t operand = v[at], coeff = v[at + 1];
      if (operand < 0 || operand >= operands) return 0;
      const XLA_FFI_Buffer *b = (const XLA_FFI_Buffer *)frame->args.args[operand];
      if (!state[operand]) {
        int64_t n = counts[operand], lo = 0, hi = 0;
        for (int64_t i = 0; i < n; ++i) {
          int64_t x = ef_int(b->dtype, b->data, i);
          if (b->dtype == XLA_FFI_DataType_U64 && x < 0) return 0;   /* beyond int64 */
          if (i == 0 || x < lo) lo = x;
          if (i == 0 || x > hi) hi = x;
        }
        lows[operand] = lo;
        highs[operand] = hi;
        state[operand] = n > 0 ? 1 : 2;
      }
      if (state[operand] == 2) { reads = 0; continue; }   /* reads nothing */
      __int128 a = (__int128)coeff * lows[operand], c = (__int128)coeff * highs[operand];
      low += a < c ? a : c;
      high += a < c ? c : a;
    }
    if (reads && (low < 0 || high >= length)) return 0;
  }
  return 1;
}

XLA_FFI_Error *einfuse_ffi_run(XLA_FFI_CallFrame *frame, const ef_kernel_fn *kernels,
                               int64_t count, const ef_kernel_fn *verified,
                               int64_t verified_count) {
  const XLA_FFI_Api *api = frame->api;
  if (ef_not_executing(frame)) return 0;
  const XLA_FFI_Array *layout_attr = ef_array(&frame->attrs, "layout", XLA_FFI_DataType_S64);
  const XLA_FFI_Array *ints_attr = ef_array(&frame->attrs, "ints", XLA_FFI_DataType_S64);
  const XLA_FFI_Array *fills_attr = ef_array(&frame->attrs, "fills", XLA_FFI_DataType_F64);
  if (!layout_attr || !ints_attr || !fills_attr || fills_attr->size != 2 ||
      layout_attr->size < 5)
    return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "einfuse: the custom call lacks its layout, ints or fills attributes");
  const int64_t *layout = (const int64_t *)layout_attr->data;
  size_t size = layout_attr->size, at = 5;
  int64_t token = layout[0], threads = layout[1], operands = layout[2], slots = layout[3],
          params = layout[4];
  char message[1024];
  if (slots < 1 || slots > EF_MAX_SLOTS || params < 0 || params > EF_MAX_PARAMS)
    return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "einfuse: a malformed layout");
  if (frame->args.size != operands || frame->rets.size != 1) {
    snprintf(message, sizeof message, "einfuse: the kernel takes %lld arrays and gives 1 "
             "result; XLA passed %lld and %lld", (long long)operands,
             (long long)frame->args.size, (long long)frame->rets.size);
    return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, message);
  }
  int64_t counts[EF_MAX_SLOTS + EF_MAX_PARAMS];
  if (operands > EF_MAX_SLOTS + EF_MAX_PARAMS)
    return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "einfuse: too many operands");
  for (int64_t k = 0; k < operands; ++k) {
    if (frame->args.types[k] != XLA_FFI_ArgType_BUFFER ||
        !ef_matches((const XLA_FFI_Buffer *)frame->args.args[k], layout, size, &at,
                    &counts[k])) {
      snprintf(message, sizeof message, "einfuse: array %lld passed by XLA does not have "
               "the dtype and shape the kernel was planned for", (long long)k);
      return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, message);
    }
  }
  ef_scratch scratch;
  memset(&scratch, 0, sizeof scratch);
  scratch.n = (int)slots;
  if (at + 2 * (size_t)(slots - 1) + (size_t)params + 3 > size)
    return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "einfuse: a malformed layout");
  for (int64_t s = 0; s + 1 < slots; ++s) {
    int64_t operand = layout[at], want = layout[at + 1];
    at += 2;
    const XLA_FFI_Buffer *b = (const XLA_FFI_Buffer *)frame->args.args[operand < 0 ||
                                operand >= operands ? 0 : operand];
    if (operand < 0 || operand >= operands || ef_size(want) == 0) {
      ef_free(&scratch);
      return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, "einfuse: a malformed layout");
    }
    if (b->dtype == want) {
      scratch.data[s] = b->data;
      continue;
    }
    int64_t n = counts[operand];
    void *copy = malloc((size_t)(n > 0 ? n : 1) * ef_size(want));
    if (!copy) {
      ef_free(&scratch);
      return ef_error(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
                      "einfuse: out of memory converting an input");
    }
    ef_convert(b->dtype, b->data, want, copy, n);
    scratch.data[s] = copy;
    scratch.owned[s] = 1;
  }
  double doubles[EF_MAX_PARAMS + 1];
  int64_t integers[EF_MAX_PARAMS + 1];
  doubles[0] = 0.0;
  integers[0] = 0;
  for (int64_t p = 0; p < params; ++p) {
    int64_t operand = layout[at++];
    const XLA_FFI_Buffer *b = (const XLA_FFI_Buffer *)frame->args.args[operand < 0 ||
                                operand >= operands ? 0 : operand];
    if (operand < 0 || operand >= operands || b->rank != 0) {
      ef_free(&scratch);
      return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                      "einfuse: a scalar parameter is not a 0-d array");
    }
    double value = ef_real(b->dtype, b->data, 0);
    doubles[p] = value;
    /* as plan.call_arguments: an int64 where the value is a whole number that fits */
    if (!ef_is_float(b->dtype) && b->dtype != XLA_FFI_DataType_U64)
      integers[p] = ef_int(b->dtype, b->data, 0);
    else
      integers[p] = (value == value && value == (double)(int64_t)value &&
                     value >= -9223372036854775808.0 && value < 9223372036854775808.0)
                    ? (int64_t)value : 0;
  }
  int64_t result_dtype = layout[at++];
  size_t out_at = at;
  int64_t out_count = 0;
  const XLA_FFI_Buffer *result = (const XLA_FFI_Buffer *)frame->rets.rets[0];
  XLA_FFI_Buffer out_view = *result;
  int64_t out_dtype = layout[at];
  out_view.dtype = (XLA_FFI_DataType)out_dtype;
  if (frame->rets.types[0] != XLA_FFI_RetType_BUFFER || result->dtype != result_dtype ||
      !ef_matches(&out_view, layout, size, &out_at, &out_count) || ef_size(out_dtype) == 0) {
    ef_free(&scratch);
    return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "einfuse: the result buffer XLA passed is not the one planned");
  }
  if (out_count == 0) {   /* nothing to compute, as the C backend does */
    ef_free(&scratch);
    return 0;
  }
  int64_t last = slots - 1;
  if (result_dtype == out_dtype) {
    scratch.data[last] = result->data;
  } else {
    scratch.data[last] = malloc((size_t)out_count * ef_size(out_dtype));
    scratch.owned[last] = 1;
    if (!scratch.data[last]) {
      ef_free(&scratch);
      return ef_error(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED,
                      "einfuse: out of memory for the result");
    }
  }
  /* one parallel region at a time: a kernel starting while another runs stays on its
     calling thread (XLA's pool threads would otherwise each start an OpenMP team) */
  const int64_t *ints = (const int64_t *)ints_attr->data;
  const XLA_FFI_Array *verify = ef_array(&frame->attrs, "verify", XLA_FFI_DataType_S64);
  const XLA_FFI_Array *vints = ef_array(&frame->attrs, "vints", XLA_FFI_DataType_S64);
  if (verified_count > 0 && verify && vints && ef_in_range(verify, frame, counts)) {
    kernels = verified;
    count = verified_count;
    ints = (const int64_t *)vints->data;
  }
  int parallel = threads != 1 && !__atomic_exchange_n(&ef_busy, 1, __ATOMIC_ACQUIRE);
  int32_t flag = 0;
  for (int64_t k = 0; k < count; ++k)
    kernels[k](scratch.data, ints, doubles, integers,
               (const double *)fills_attr->data, parallel ? (int)threads : 1, &flag);
  if (parallel) __atomic_store_n(&ef_busy, 0, __ATOMIC_RELEASE);
  if (flag) {
    ef_free(&scratch);
    ef_reporter report = __atomic_load_n(&ef_report, __ATOMIC_ACQUIRE);
    int64_t written = 0;
    void *data[EF_MAX_SLOTS + EF_MAX_PARAMS];
    for (int64_t k = 0; k < operands; ++k)
      data[k] = ((const XLA_FFI_Buffer *)frame->args.args[k])->data;
    if (report)
      written = report(token, data, operands, message, (int64_t)sizeof message);
    if (written <= 0 || written >= (int64_t)sizeof message)
      snprintf(message, sizeof message, "einfuse: an index array holds a value outside "
               "the axis it indexes (bounds='check')");
    return ef_error(api, XLA_FFI_Error_Code_OUT_OF_RANGE, message);
  }
  if (result_dtype != out_dtype)
    ef_convert(out_dtype, scratch.data[last], result_dtype, result->data, out_count);
  ef_free(&scratch);
  return 0;
}
"""

_STUB = """
typedef void *(*ef_ffi_runner)(void *, const void *, int64_t, const void *, int64_t);
static ef_ffi_runner ef_ffi_run = 0;
static const void *ef_ffi_verified = 0;
static int64_t ef_ffi_verified_count = 0;
void einfuse_ffi_bind(void *runner, const void *verified, int64_t verified_count) {
  ef_ffi_verified = verified;
  ef_ffi_verified_count = verified_count;
  ef_ffi_run = (ef_ffi_runner)runner;
}
void *einfuse_ffi_handler(void *frame) {
  static void (*const kernels[])(void **, const int64_t *, const double *, const int64_t *,
                                 const double *, int, int32_t *) = { @KERNELS@ };
  return ef_ffi_run(frame, (const void *)kernels, @COUNT@, ef_ffi_verified,
                    ef_ffi_verified_count);
}
"""


def support_source(header: str, version: str) -> str:
    """The support library's source for the c_api.h at ``header`` (an absolute path, the
    only outside text in it, checked to be a plain path) of jaxlib ``version`` (which
    keys the cached library: new headers, new library)."""
    return ffi_prelude(header, version) + SUPPORT_SOURCE


def ffi_prelude(header: str, version: str) -> str:
    """FFI_PRELUDE for the c_api.h at ``header`` (an absolute path, checked to be a plain
    path) of jaxlib ``version``; ValueError for anything else."""
    if not _PATH.match(header) or not _PATH.match(version):
        raise ValueError(f"unexpected jaxlib header path or version: {header!r} {version!r}")
    return FFI_PRELUDE.replace("@HEADER@", header).replace("@VERSION@", version)


def kernel_stub(kernel_names) -> str:
    """The entry point XLA calls for one kernel library: its kernels, in order, handed
    to the support library's einfuse_ffi_run (bound after loading)."""
    from ..identifiers import name
    names = [name(k) for k in kernel_names]
    return _STUB.replace("@KERNELS@", ", ".join(names)).replace("@COUNT@", str(len(names)))
