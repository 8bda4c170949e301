"""Every Triton launch einfuse makes goes through here (statements, row groups,
attention, tuning trials), for two reasons:

* **the repeated launch is direct.** ``kernel[grid](...)`` runs ``JITFunction.run`` on
  every call: the argument binder, the specialisation of each argument and the cache
  key (about 18 us on an H100 machine against 7 us for the compiled kernel's own
  launcher).  A :class:`PreparedLaunch` is one kernel with one grid and one set of
  launch options; its first call goes through Triton, which returns the
  ``CompiledKernel`` (Triton 3.x) that this module keeps; later calls hand the
  arguments straight to ``CompiledKernel.run`` with the grid, the stream, the
  launch metadata and Triton's launch hooks, as ``JITFunction.run`` does.  A call whose
  arguments would be specialised differently (a tensor of another dtype, or not 16-byte
  aligned where the first call's was; an int of another width, or 1 or a multiple of 16
  where the first's was not, or the reverse) takes Triton's path, which compiles or
  finds that specialisation.  Under
  ``TRITON_INTERPRET=1`` there is no compiled kernel (the interpreter's launch returns
  None): every call is the interpreter's.
* **launches can be observed** (:func:`observed`: one record per launch, how the tests
  count kernels per call) **and stubbed** (:func:`stubbed`: nothing runs, how the host
  benchmark isolates einfuse's own time per call, benchmarks/triton_host_call.py)."""

from __future__ import annotations

import contextlib
import operator
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

_observers: List[List["Launched"]] = []
_stubbed = 0
_lock = threading.Lock()


@dataclass(frozen=True)
class Launched:
    """One launch as an observer sees it: the kernel's name and the grid."""
    kernel: str
    grid: Tuple[int, ...]


@contextlib.contextmanager
def observed() -> Iterator[List[Launched]]:
    """A list that receives one :class:`Launched` per Triton launch made inside the
    block (by any thread)."""
    seen: List[Launched] = []
    with _lock:
        _observers.append(seen)
    try:
        yield seen
    finally:
        with _lock:
            _observers.remove(seen)


@contextlib.contextmanager
def stubbed() -> Iterator[None]:
    """Launches inside the block are observed but not run: the kernels' outputs are
    left as allocated.  For measuring the host path alone; never for results."""
    global _stubbed
    with _lock:
        _stubbed += 1
    try:
        yield
    finally:
        with _lock:
            _stubbed -= 1


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", None)
    return getattr(fn, "__name__", None) or getattr(kernel, "__name__", type(kernel).__name__)


def _notify(kernel, grid) -> bool:
    """Tell the observers; True where the launch is to be skipped (stubbed)."""
    if _observers:
        record = Launched(_kernel_name(kernel), tuple(grid))
        with _lock:
            for seen in _observers:
                seen.append(record)
    return _stubbed > 0


def launch_once(kernel, grid, args, options: Dict[str, object]):
    """``kernel[grid](*args, **options)``, observed: for launches that are not repeated
    as such (a tuning trial, a one-off)."""
    if _notify(kernel, grid):
        return None
    return kernel[grid](*args, **options)


def _int_kind(value: int):
    if value == 1:
        return "one"        # (Triton makes an int 1 a constant of the compiled kernel)
    width = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64" if -2 ** 63 <= value < 2 ** 63 \
        else "u64"
    return width, value % 16 == 0


def _specialisation(args) -> Tuple:
    """What Triton specialises a compiled kernel on, per argument (triton 3.x): a
    tensor's dtype and 16-byte alignment, an int's width and whether it is 1 or a
    multiple of 16 (floats: nothing)."""
    found = []
    for arg in args:
        kind = type(arg)
        if kind is int:
            found.append(_int_kind(arg))
        elif kind is float:
            found.append(None)
        elif kind is bool:
            found.append(bool)
        else:
            pointer = getattr(arg, "data_ptr", None)
            found.append((arg.dtype, pointer() % 16 == 0) if pointer is not None else kind)
    return tuple(found)


def same_specialisation(first) -> Callable[[Tuple], bool]:
    """``same(args)``: whether ``args`` specialise as ``first`` did (_specialisation),
    asked cheaply per call: the arguments' types at once, each tensor's dtype and
    alignment, the ints compared as values first (a training loop passes the same ones)
    and by kind only where they differ."""
    types = tuple(map(type, first))
    tensors = tuple((position, arg.dtype, arg.data_ptr() % 16 == 0)
                    for position, arg in enumerate(first)
                    if types[position] not in (int, float, bool) and
                    hasattr(arg, "data_ptr"))
    int_positions = tuple(p for p, kind in enumerate(types) if kind is int)
    # (the ints read by one itemgetter, which names the first position twice so that
    # it always returns a tuple: a row group's launch passes a dozen ints, and a
    # generator over their positions cost a third of the check)
    ints_of = operator.itemgetter(*int_positions, *int_positions[:1]) if int_positions \
        else None
    ints = ints_of(first) if ints_of is not None else ()
    kinds = tuple(map(_int_kind, ints))

    def same(args) -> bool:
        if tuple(map(type, args)) != types:
            return False
        for position, dtype, aligned in tensors:
            tensor = args[position]
            if tensor.dtype != dtype or (tensor.data_ptr() % 16 == 0) != aligned:
                return False
        if ints_of is not None:
            values = ints_of(args)
            if values != ints and tuple(map(_int_kind, values)) != kinds:
                return False
        return True
    return same


Direct = Callable[[Tuple], None]


def stream_getter() -> Callable[[int], object]:
    """The active driver's current-stream function (what JITFunction.run asks per
    launch); raises where there is no GPU driver."""
    from triton.runtime import driver
    return driver.active.get_current_stream


def direct_launcher(compiled, grid, tail: Tuple, device_index: int) -> Optional[Direct]:
    """``launch(args)``: ``compiled`` (what Triton's launch returned) run on ``args``
    followed by ``tail`` (the constexpr values, in the kernel's parameter order) through
    its own launcher, or None where it is not a compiled kernel this code knows (the
    interpreter returns None; a Triton without ``run``/``function``/``packed_metadata``/
    ``launch_metadata`` keeps the usual launch)."""
    if compiled is None or not all(hasattr(compiled, attribute) for attribute in (
            "run", "function", "packed_metadata", "launch_metadata")):
        return None
    try:
        from triton import knobs
        runtime = knobs.runtime
        get_stream = stream_getter()
    except Exception:    # noqa: BLE001 -- no GPU driver here: Triton's own launch stays
        return None
    grid = tuple(grid)
    g0, g1, g2 = grid + (1,) * (3 - len(grid))

    def launch(args):
        stream = get_stream(device_index)
        every = (*args, *tail)
        enter = runtime.launch_enter_hook
        # (Triton's launch_metadata is None, and asks nothing, where no enter hook is
        # set -- every Triton with ``knobs`` -- so it is called only under a hook)
        metadata = None if enter is None else compiled.launch_metadata(grid, stream, *every)
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata,
                     metadata, enter, runtime.launch_exit_hook, *every)
    return launch


class PreparedLaunch:
    """One kernel, grid and set of launch options (``options``: num_warps, num_stages;
    ``constexprs``: the kernel's constexpr parameters, which follow the positional
    arguments in its signature), called with the positional arguments of one launch.
    ``device_index``: the CUDA device (None: the interpreter, or the current device)."""

    __slots__ = ("kernel", "grid", "options", "tail", "device_index", "_direct",
                 "_specialised", "_tried", "_lock")

    def __init__(self, kernel, grid, options: Dict[str, object],
                 constexprs: Dict[str, object], device_index: Optional[int] = None):
        self.kernel, self.grid = kernel, tuple(grid)
        self.options = {**options, **constexprs}
        self.tail = _constexpr_tail(kernel, constexprs)
        self.device_index = device_index or 0
        self._direct: Optional[Direct] = None
        self._specialised: Optional[Callable[[Tuple], bool]] = None
        self._tried = False
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        """Whether later calls of this specialisation bypass Triton's binder."""
        return self._direct is not None

    def __call__(self, *args) -> None:
        if (_observers or _stubbed) and _notify(self.kernel, self.grid):
            return
        direct = self._direct
        if direct is not None and self._specialised(args):
            direct(args)
            return
        compiled = self.kernel[self.grid](*args, **self.options)
        if not self._tried:
            self.adopt(compiled, args)

    def adopt(self, compiled, args) -> None:
        """Keep ``compiled`` (the first launch's result) for the direct path, where it is
        a compiled kernel and the constexprs are known in parameter order."""
        with self._lock:
            if self._tried:
                return
            self._tried = True
            if self.tail is None or len(args) + len(self.tail) != len(self.kernel.params):
                return
            direct = direct_launcher(compiled, self.grid, self.tail, self.device_index)
            if direct is not None:
                self._specialised = same_specialisation(args)
                self._direct = direct


def _constexpr_tail(kernel, constexprs: Dict[str, object]) -> Optional[Tuple]:
    """The constexpr values in the order of the kernel's last parameters, or None where
    the kernel's parameters are not known (an interpreted kernel: no direct path) or
    its trailing parameters are not exactly these constexprs."""
    params = getattr(kernel, "params", None)
    if params is None:
        return None
    names = [getattr(p, "name", None) for p in params]
    if not constexprs:
        return ()
    count = len(constexprs)
    if len(names) < count or set(names[-count:]) != set(constexprs):
        return None
    return tuple(constexprs[name] for name in names[-count:])
