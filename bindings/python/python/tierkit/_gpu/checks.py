"""Argument checks of the GPU API (TypeError for types and dtypes, ValueError for the rest) and
the stream / capture / device helpers."""

from __future__ import annotations

from typing import Optional

import torch

from tierkit import _native

Tensor = torch.Tensor

def _tensor(t, name: str) -> Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    return t


def _cuda(t, name: str, dtypes, ndim: Optional[int] = None, device=None) -> Tensor:
    t = _tensor(t, name)
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}, expected {want}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.data_ptr() % t.element_size() != 0:
        raise ValueError(f"{name} is not aligned for its dtype")
    return t


def _contiguous(t: Tensor, name: str, min_numel: int = 0) -> Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if t.numel() < min_numel:
        raise ValueError(f"{name} has {t.numel()} elements, the call needs {min_numel}")
    return t


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _range(t, name: str, need: int, kind: str, device=None) -> Tensor:
    """Checks a caller-owned memory tensor (any dtype, counted in bytes): a ``kind`` (``"cpu"``
    or ``"cuda"``) tensor, on ``device`` if given, contiguous, 16-byte aligned, of at least
    ``need`` bytes. TypeError for a non-tensor, ValueError for the rest."""
    t = _tensor(t, name)
    if t.device.type != kind:
        want = "a CPU" if kind == "cpu" else "a CUDA"
        raise ValueError(f"{name} must be {want} tensor, got a tensor on {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, expected {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    if t.data_ptr() % 16 != 0:
        raise ValueError(f"{name} must be 16-byte aligned (data_ptr {t.data_ptr():#x})")
    if _nbytes(t) < need:
        raise ValueError(f"{name} has {_nbytes(t)} bytes, the geometry needs {need}")
    return t


def _stream(device: torch.device) -> int:
    return torch.cuda.current_stream(device).cuda_stream


def _step_stream(stream, dev: torch.device):
    """The object's step stream: ``stream`` or the current stream of ``dev``; a stream of another
    device is a ValueError (its work would be ordered on the wrong device)."""
    if stream is None:
        return torch.cuda.current_stream(dev)
    sdev = torch.device(stream.device)
    if sdev.type != "cuda" or (sdev.index if sdev.index is not None else dev.index) != dev.index:
        raise ValueError(f"stream is on {sdev}, the object on {dev}: pass a stream of {dev}")
    return stream


def _no_capture(what: str, device: torch.device) -> None:
    """Refuses a host call while the current stream of the object's ``device`` (not the current
    device's) is capturing a CUDA graph. The native objects check again in Rust, on that stream
    and on the object's step stream, whichever way they are called."""
    if not torch.cuda.is_available():
        return
    with torch.cuda.device(device):
        capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        raise RuntimeError(
            f"{what} synchronises or changes tier state on the host and cannot run while the "
            "current stream is capturing a CUDA graph; call it between replays"
        )


def _device(device) -> torch.device:
    d = torch.device("cuda") if device is None else torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {d}")
    if d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def warmup(device=None) -> None:
    """Loads tierkit's kernels on ``device`` (NVRTC compile at first use): call before capturing
    a CUDA graph so no module loads inside the capture."""
    _native.warmup(_device(device).index)

