"""Views of tierkit's GPU memory as CUDA tensors, the pinned ranges tierkit owns, and the
lifetime helpers (closable objects, closing at interpreter exit)."""

from __future__ import annotations

import atexit
import threading
import weakref

import torch

from tierkit import _native
from tierkit._gpu.checks import _no_capture, _tensor

Tensor = torch.Tensor

_PINNED: dict = {}  # key (a private object) -> (ptr, bytes)
_PINNED_LOCK = threading.Lock()


def _track_pinned(owner, ptr: int, nbytes: int) -> weakref.finalize:
    """Registers the pinned range ``[ptr, ptr + nbytes)`` of ``owner``'s memory, ``owner`` being the
    native object that frees (or unregisters) it when it is collected — after ``close()`` *and*
    the last view. The entry lives exactly as long: none outlives its memory, none is dropped
    while the memory is still pinned, and no id is reused as a key."""
    return _track(_PINNED, owner, (int(ptr), int(nbytes)))


def _track(table: dict, owner, entry) -> weakref.finalize:
    """Lists ``entry`` in ``table`` (``_PINNED`` or ``_DEVICE``) under a fresh key until the
    returned finalizer runs (called, or ``owner`` collected)."""
    key = object()
    with _PINNED_LOCK:
        table[key] = entry
    return weakref.finalize(owner, _untrack, table, key)


def _untrack(table: dict, key) -> None:
    with _PINNED_LOCK:
        table.pop(key, None)


class _DeviceArray:
    """A ``__cuda_array_interface__`` over tierkit memory; holds its owner (the native object, not
    the wrapper, so no reference cycle runs through the wrapper) alive. ``close()`` only marks the
    owner closed: its memory is freed, after a device synchronize, when the owner and every view
    are gone, so a view never reads freed memory. A captured CUDA graph holds no reference:
    destroy graphs that use the memory before ``close()``."""

    def __init__(self, owner, ptr: int, shape, typestr: str):
        self._owner = owner
        self.__cuda_array_interface__ = {
            "shape": tuple(int(s) for s in shape),
            "typestr": typestr,
            "data": (int(ptr), False),
            "version": 3,
            "strides": None,
            # the producer has no pending work on any stream: no synchronisation needed
            "stream": None,
        }


def _view(owner, ptr: int, shape, typestr: str, device: torch.device) -> Tensor:
    with torch.cuda.device(device):
        return torch.as_tensor(_DeviceArray(owner, ptr, shape, typestr), device=device)


def pinned_ranges():
    """The pinned (mapped) host ranges tierkit owns now, as ``[(device_ptr, bytes)]``."""
    with _PINNED_LOCK:
        return sorted(_PINNED.values())


def is_tierkit_pinned(t: Tensor) -> bool:
    """Whether ``t``'s data lies inside pinned host memory tierkit owns (``Tensor.is_pinned()``
    misses mapped and ``cudaHostRegister`` memory)."""
    t = _tensor(t, "t")
    lo = t.data_ptr()
    if t.numel() == 0:
        return False
    if any(st < 0 for st in t.stride()):
        return False
    # the bytes the view spans (strided views included)
    hi = lo + (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()
    with _PINNED_LOCK:
        return any(p <= lo and hi <= p + n for p, n in _PINNED.values())


_PAGE = 4096  # registration pins whole pages


def _overlaps_tierkit_pinned(ptr: int, nbytes: int) -> bool:
    """Whether the pages of ``[ptr, ptr + nbytes)`` overlap those of a pinned range tierkit tracks
    (two ranges sharing one page cannot both be registered)."""

    def pages(p: int, n: int):
        return p // _PAGE, (p + max(n, 1) - 1) // _PAGE

    lo, hi = pages(ptr, nbytes)
    with _PINNED_LOCK:
        return any(a <= hi and lo <= b for a, b in (pages(p, n) for p, n in _PINNED.values()))


_DEVICE: dict = {}  # key -> (device index, ptr, bytes): HBM a tierkit object uses (its own or an engine's)


def _track_device(owner, device: int, ptr: int, nbytes: int) -> weakref.finalize:
    """Registers the device range ``[ptr, ptr + nbytes)`` on ``device`` that ``owner`` (a native
    object) writes: its own HBM or engine memory lent to it, so that no second object is given
    memory the first one writes. Listed until the returned finalizer is called (the object's
    ``close()``, after which tierkit writes none of it) or ``owner`` is collected."""
    return _track(_DEVICE, owner, (int(device), int(ptr), int(nbytes)))


def device_ranges():
    """The device ranges open tierkit objects write (their own HBM and engine memory lent to
    them), as ``[(device_index, device_ptr, bytes)]``. A new object refuses engine memory
    overlapping one of them; a range leaves the list when its object is closed."""
    with _PINNED_LOCK:
        return sorted(_DEVICE.values())


def _overlaps_tierkit_device(device: int, ptr: int, nbytes: int) -> bool:
    """Whether ``[ptr, ptr + nbytes)`` on ``device`` overlaps device memory a live tierkit object
    writes."""
    lo, hi = int(ptr), int(ptr) + max(int(nbytes), 1)
    with _PINNED_LOCK:
        return any(d == device and p < hi and lo < p + n for d, p, n in _DEVICE.values())


# Held across "check that engine memory is free, build the object, track its ranges", so two
# threads cannot lend one range to two objects at once.
_LEND_LOCK = threading.RLock()


def _refuse_tierkit_device(t: Tensor, nbytes: int, dev: torch.device, name: str) -> None:
    """ValueError if the first ``nbytes`` of CUDA tensor ``t`` overlap device memory an open
    tierkit object writes (another bank's slots or table, another pool's arena, or engine memory
    already lent to one). Call under ``_LEND_LOCK``."""
    if _overlaps_tierkit_device(dev.index, t.data_ptr(), nbytes):
        raise ValueError(
            f"{name} overlaps device memory another open tierkit object uses: pass memory of "
            "your own (or close that object first)"
        )


_LIVE = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for obj in list(_LIVE):
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


class _Closable:
    _closed = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise _native.ClosedError(f"{type(self).__name__} is closed")

    # Untrack callbacks of the device ranges the object writes (``_track_device``), set by the
    # objects that own or borrow device memory.
    _device_tracks = ()

    def _close_native(self, what: str) -> bool:
        """Closes ``self._native`` once: refused during a CUDA graph capture (``what`` names the
        call in the error) before anything is marked, then the object is closed and its device
        ranges are released. False when it was already closed."""
        if self._closed:
            return False
        _no_capture(what, self.device)
        self._native.close()  # refuses during a capture too, before anything is marked
        self._closed = True
        for untrack in self._device_tracks:  # tierkit writes none of it from now on
            untrack()
        return True

