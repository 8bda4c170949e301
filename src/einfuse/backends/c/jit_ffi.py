"""The XLA FFI handler of ``ef.jit`` kernels (runtime/jit_ffi.py): one support library,
written against XLA's plain-C FFI API (``xla/ffi/api/c_api.h``, shipped with jaxlib),
whose one handler runs any registered ``ef.jit`` entry point (``int ef_jit(void **)``
of backends/c/loops.py, or ``int ef_jit(void **, int threads)`` of c_loops_batch.py).

Why one shared handler rather than one per kernel library: the kernel libraries are
the very ones the eager call and the host callback use, so the FFI route compiles
nothing more per kernel; the handler finds its kernel by a ``token`` attribute of the
custom call, in a table that Python fills (:func:`register`) when the call is lowered.
A token that this process has not registered (an executable deserialised without being
lowered here) is an XLA error saying so, never a jump through a stale pointer.

What the handler does with a call frame, in order:

1. answers XLA's metadata query (the API version of these headers) and ignores every
   stage but EXECUTE;
2. finds the record of its ``token``;
3. validates what XLA passes against the record: the number of operands and results,
   each one's dtype, rank and dims; a mismatch is an XLA FFI error naming it;
4. lays out the entry's ``void **`` argument array from XLA's buffers and the
   kernel's constant arrays (held by Python), in the entry's own order;
5. runs the entry -- a batched one with OpenMP's default team, unless another einfuse
   kernel called from XLA (this handler's or the statement handler's: they share one
   flag) holds a parallel region (XLA runs independent operations on several threads
   of its pool): then on the calling thread, so that teams never multiply -- and
   turns a failure (an intermediate that could not be allocated) into an XLA error
   carrying einfuse's message for that kernel.

Nothing here imports JAX: the caller passes the header path and the jaxlib version."""

from __future__ import annotations

import ctypes
import enum
import functools
import hashlib
import os
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence, Tuple

from . import build as c_build
from .ffi_support import XLA_DTYPES, ffi_prelude

TARGET = "einfuse_jit"     # the one XLA custom-call target of every ef.jit kernel

SOURCE = r"""
typedef int (*ef_plain_entry)(void **);
typedef int (*ef_team_entry)(void **, int);

typedef struct ef_record {
  int64_t token;
  void *entry;
  int takes_threads;
  int64_t operands, results, slots;
  int64_t *shapes;     /* per operand, then per result: XLA dtype, rank, dims */
  int64_t *order;      /* per entry slot: source (0 operand, 1 result, 2 constant), index */
  void **constants;
  char *failure;       /* einfuse's message when the entry fails */
  struct ef_record *next;
} ef_record;

#define EF_BUCKETS 1024
static ef_record *ef_table[EF_BUCKETS];
static int ef_own_busy = 0;
static int *ef_busy = &ef_own_busy;   /* the statement handler's, once lent (at load) */

void einfuse_jit_share_busy(int *flag) { if (flag) ef_busy = flag; }

static ef_record *ef_find(int64_t token) {
  ef_record *r = __atomic_load_n(&ef_table[(uint64_t)token % EF_BUCKETS], __ATOMIC_ACQUIRE);
  while (r && r->token != token) r = r->next;
  return r;
}

/* Called from Python under its lock; the record is complete before it is published.
   0: registered; 1: the token is taken; 2: out of memory. */
int einfuse_jit_register(int64_t token, void *entry, int takes_threads, int64_t operands,
                         int64_t results, const int64_t *shapes, int64_t shapes_len,
                         int64_t slots, const int64_t *order, void *const *constants,
                         int64_t constant_count, const char *failure) {
  if (ef_find(token)) return 1;
  ef_record *r = calloc(1, sizeof *r);
  if (!r) return 2;
  r->shapes = malloc((size_t)(shapes_len > 0 ? shapes_len : 1) * sizeof(int64_t));
  r->order = malloc((size_t)(2 * slots > 0 ? 2 * slots : 1) * sizeof(int64_t));
  r->constants = malloc((size_t)(constant_count > 0 ? constant_count : 1) * sizeof(void *));
  r->failure = malloc(strlen(failure) + 1);
  if (!r->shapes || !r->order || !r->constants || !r->failure) {
    free(r->shapes); free(r->order); free(r->constants); free(r->failure); free(r);
    return 2;
  }
  memcpy(r->shapes, shapes, (size_t)shapes_len * sizeof(int64_t));
  memcpy(r->order, order, (size_t)(2 * slots) * sizeof(int64_t));
  memcpy(r->constants, constants, (size_t)constant_count * sizeof(void *));
  strcpy(r->failure, failure);
  r->token = token;
  r->entry = entry;
  r->takes_threads = takes_threads;
  r->operands = operands;
  r->results = results;
  r->slots = slots;
  ef_record **head = &ef_table[(uint64_t)token % EF_BUCKETS];
  r->next = *head;
  __atomic_store_n(head, r, __ATOMIC_RELEASE);
  return 0;
}

static int ef_token(const XLA_FFI_Attrs *attrs, int64_t *token) {
  for (int64_t k = 0; k < attrs->size; ++k) {
    const XLA_FFI_ByteSpan *key = attrs->names[k];
    if (key->len == 5 && memcmp(key->ptr, "token", 5) == 0 &&
        attrs->types[k] == XLA_FFI_AttrType_SCALAR) {
      const XLA_FFI_Scalar *scalar = (const XLA_FFI_Scalar *)attrs->attrs[k];
      if (scalar->dtype != XLA_FFI_DataType_S64) return 0;
      *token = *(const int64_t *)scalar->value;
      return 1;
    }
  }
  return 0;
}

/* whether the buffer has (dtype, rank, dims) at shapes[*at]; advances *at */
static int ef_matches(const XLA_FFI_Buffer *b, const int64_t *shapes, int64_t *at) {
  int64_t dtype = shapes[*at], rank = shapes[*at + 1];
  int ok = b->dtype == dtype && b->rank == rank;
  *at += 2;
  for (int64_t d = 0; d < rank; ++d)
    if (ok && b->dims[d] != shapes[*at + d]) ok = 0;
  *at += rank;
  return ok;
}

XLA_FFI_Error *einfuse_jit_handler(XLA_FFI_CallFrame *frame) {
  const XLA_FFI_Api *api = frame->api;
  if (ef_not_executing(frame)) return 0;
  char message[512];
  int64_t token = 0;
  if (!ef_token(&frame->attrs, &token))
    return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "einfuse: the ef.jit custom call lacks its int64 token attribute");
  const ef_record *r = ef_find(token);
  if (!r) {
    snprintf(message, sizeof message, "einfuse: the ef.jit kernel of token %lld is not "
             "registered in this process (an executable made elsewhere: lower the "
             "function in this process first)", (long long)token);
    return ef_error(api, XLA_FFI_Error_Code_FAILED_PRECONDITION, message);
  }
  if (frame->args.size != r->operands || frame->rets.size != r->results) {
    snprintf(message, sizeof message, "einfuse: the ef.jit kernel takes %lld arrays and "
             "gives %lld; XLA passed %lld and %lld", (long long)r->operands,
             (long long)r->results, (long long)frame->args.size, (long long)frame->rets.size);
    return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, message);
  }
  int64_t at = 0;
  for (int64_t k = 0; k < r->operands + r->results; ++k) {
    int is_arg = k < r->operands;
    int64_t i = is_arg ? k : k - r->operands;
    int buffer = is_arg ? frame->args.types[i] == XLA_FFI_ArgType_BUFFER
                        : frame->rets.types[i] == XLA_FFI_RetType_BUFFER;
    const XLA_FFI_Buffer *b = is_arg ? (const XLA_FFI_Buffer *)frame->args.args[i]
                                     : (const XLA_FFI_Buffer *)frame->rets.rets[i];
    if (!buffer || !ef_matches(b, r->shapes, &at)) {
      snprintf(message, sizeof message, "einfuse: %s %lld passed by XLA does not have the "
               "dtype and shape the ef.jit kernel was compiled for",
               is_arg ? "operand" : "result", (long long)i);
      return ef_error(api, XLA_FFI_Error_Code_INVALID_ARGUMENT, message);
    }
  }
  void *small[64];
  void **args = r->slots <= 64 ? small : malloc((size_t)r->slots * sizeof(void *));
  if (!args)
    return ef_error(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, r->failure);
  for (int64_t s = 0; s < r->slots; ++s) {
    int64_t source = r->order[2 * s], index = r->order[2 * s + 1];
    args[s] = source == 0 ? ((const XLA_FFI_Buffer *)frame->args.args[index])->data
            : source == 1 ? ((const XLA_FFI_Buffer *)frame->rets.rets[index])->data
            : r->constants[index];
  }
  int failed;
  if (r->takes_threads) {
    int team = !__atomic_exchange_n(ef_busy, 1, __ATOMIC_ACQUIRE);
    failed = ((ef_team_entry)r->entry)(args, team ? 0 : 1);
    if (team) __atomic_store_n(ef_busy, 0, __ATOMIC_RELEASE);
  } else {
    failed = ((ef_plain_entry)r->entry)(args);
  }
  if (args != small) free(args);
  if (failed) return ef_error(api, XLA_FFI_Error_Code_RESOURCE_EXHAUSTED, r->failure);
  return 0;
}
"""


class Source(enum.IntEnum):
    """Where an argument slot of an entry point points (the ``order`` table)."""
    OPERAND = 0      # an XLA operand: an argument of the function
    RESULT = 1       # an XLA result: an output of the function
    CONSTANT = 2     # one of the kernel's constant arrays, held by Python


@dataclass(frozen=True)
class EntryLayout:
    """What the handler needs of one entry point besides its address: the dtype and
    shape of every operand and result, and what each of the entry's argument slots
    holds, in the entry's order."""
    operands: Tuple[Tuple[str, Tuple[int, ...]], ...]    # (dtype name, shape)
    results: Tuple[Tuple[str, Tuple[int, ...]], ...]
    slots: Tuple[Tuple[Source, int], ...]
    takes_threads: bool

    def shape_table(self) -> Tuple[int, ...]:
        table = []
        for dtype, shape in self.operands + self.results:
            table += [XLA_DTYPES[dtype], len(shape), *shape]
        return tuple(table)


def converts(dtype_name: str) -> bool:
    """Whether the handler takes arrays of this dtype."""
    return dtype_name in XLA_DTYPES


@functools.lru_cache(maxsize=4)
def support_library(header: str, version: str) -> ctypes.CDLL:
    """The handler's library for the c_api.h at ``header`` (checked to be a plain path,
    as c_ffi_support does) of jaxlib ``version``: built once, cached on disk."""
    library = c_build.load(ffi_prelude(header, version) + SOURCE)   # ValueError: bad path
    library.einfuse_jit_register.restype = ctypes.c_int
    library.einfuse_jit_register.argtypes = [
        ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64,
        ctypes.c_char_p]
    # one flag for both handlers, so that a statement kernel and a batched ef.jit kernel
    # that XLA runs at the same time do not both start an OpenMP team
    from .ffi import support_library as statement_support
    try:
        statements = statement_support(header, version)
    except c_build.CompileError:
        return library          # each handler keeps its own flag
    statements.einfuse_ffi_busy_flag.restype = ctypes.c_void_p
    library.einfuse_jit_share_busy.argtypes = [ctypes.c_void_p]
    library.einfuse_jit_share_busy(statements.einfuse_ffi_busy_flag())
    return library


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def library_location(address: int) -> Tuple:
    """The library file holding ``address`` and its offset there, the same in every
    process that loads the cached library (so a token derived from it names one
    kernel across processes), or the process and address where the loader cannot say."""
    info = _DlInfo()
    try:
        dladdr = ctypes.CDLL(None).dladdr
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        if dladdr(address, ctypes.byref(info)) and info.dli_fname and info.dli_fbase:
            return (info.dli_fname.decode("utf-8", "replace"), address - info.dli_fbase)
    except (AttributeError, OSError):
        pass
    return ("process", os.getpid(), address)


_lock = threading.Lock()
_registered: Dict[int, Tuple] = {}     # token -> what it was registered for


def register(library: ctypes.CDLL, token: int, entry_address: int, layout: EntryLayout,
             constant_addresses: Sequence[int], failure: str, identity: Tuple) -> bool:
    """Registers ``token`` for the entry at ``entry_address``; ``identity`` says what it
    stands for (the same token registered again for the same identity is a no-op).
    False when the token is taken by something else (the caller picks another)."""
    with _lock:
        found = _registered.get(token)
        if found is not None:
            return found == identity
        shapes = layout.shape_table()
        order = [v for source, index in layout.slots for v in (int(source), index)]
        constants = list(constant_addresses)
        code = library.einfuse_jit_register(
            token, entry_address, int(layout.takes_threads), len(layout.operands),
            len(layout.results), (ctypes.c_int64 * max(1, len(shapes)))(*shapes),
            len(shapes), len(layout.slots), (ctypes.c_int64 * max(1, len(order)))(*order),
            (ctypes.c_void_p * max(1, len(constants)))(*constants), len(constants),
            failure.encode("utf-8", "replace"))
        if code == 2:
            raise MemoryError("registering an ef.jit kernel with the XLA handler")
        if code == 1:
            return False
        _registered[token] = identity
        return True


TOKEN_TRIES = 8     # salts tried before a caller takes its other route (8 collisions of 56 bits)


def registered_token(identity: Tuple, value, held: Dict[int, Tuple], lock,
                     register_kept: Callable[[int, object], bool]) -> Optional[int]:
    """The handler's token for ``identity`` (a digest of what a kernel is: the same in
    every process), or None where every salted token is taken by something else.

    Each try keeps ``(identity, value)`` in ``held`` under ``lock`` before the record
    that points at it is made (``held.setdefault``: a token kept already keeps the value
    it was first given, and that kept value is what ``register_kept(token, kept)``
    registers, so a record never points at arrays nothing holds).  A token kept for
    another identity, or one ``register_kept`` says is taken, moves on to the next salt."""
    for salt in range(TOKEN_TRIES):
        token = int.from_bytes(hashlib.sha256(repr((identity, salt)).encode())
                               .digest()[:7], "little")
        with lock:
            kept_identity, kept = held.setdefault(token, (identity, value))
        if kept_identity == identity and register_kept(token, kept):
            return token
    return None
