"""Weights of the MoE decode bench (``moe_decode.py``; issue 27): the host copy (pinned, mapped)
and the all-HBM copy of every expert, the dense weights, address tables, and the small torch
helpers the step and the CPU path share."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_shapes import Shape

BF16 = torch.bfloat16


TORCH_PINNED_MAX = 48 << 30


def alloc_host(nbytes: int, device: torch.device) -> tuple[torch.Tensor, bool]:
    """A CPU ``uint8 [nbytes]`` tensor; with a GPU, page-locked and mapped, so kernels read it in
    place at its own address (UVA). Up to ``TORCH_PINNED_MAX`` from torch's pinned allocator
    (``is_pinned()``: tierkit's bank uses it as it is; torch may round the size up to a power of
    two), above that registered here (``cudaHostRegister``, portable | mapped; returns True)."""
    if device.type != "cuda":
        return torch.empty(nbytes, dtype=torch.uint8), False
    if nbytes <= TORCH_PINNED_MAX:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), False
    t = torch.empty(nbytes, dtype=torch.uint8)
    torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 3))
    return t, True


class Model:
    """Weights of one shape: every expert in the host copy (``host``, ``uint8 [L, E, bytes]``)
    and in the all-HBM copy (``hbm``; on CPU a second CPU tensor standing in for it), the dense
    weights in HBM. Addresses of both copies, and of the banks the alternatives register, resolve
    back to tensors (``resolve``) for the torch reference."""

    def __init__(self, shape: Shape, device: torch.device, seed: int):
        self.shape, self.device = shape, device
        L, E, H, Fw, nb = shape.layers, shape.experts, shape.hidden, shape.ffn, shape.expert_bytes
        self.nbytes = nb
        host, self.registered = alloc_host(L * E * nb, device)
        self.host = host.view(L, E, nb)
        self.hbm = torch.empty((L, E, nb), dtype=torch.uint8, device=device)
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        for layer in range(L):
            w = self.hbm[layer].view(BF16).view(E, -1)
            w.normal_(generator=g)
            w[:, : 2 * Fw * H].mul_(H ** -0.5)
            w[:, 2 * Fw * H:].mul_(Fw ** -0.5)
            self.host[layer].copy_(self.hbm[layer], non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

        def dense(*size, fan_in):
            return (torch.randn(size, generator=g, device=device, dtype=torch.float32)
                    * fan_in ** -0.5).to(BF16)

        self.wqkv = dense(L, shape.qkv_dim, H, fan_in=H)
        self.wo = dense(L, H, shape.q_dim, fan_in=shape.q_dim)
        self.wr = dense(L, E, H, fan_in=H)
        self.shared = None
        if shape.shared:
            S, Fs = shape.shared, shape.shared_ffn
            self.shared = [(dense(L, S, 2 * Fs, H, fan_in=H), dense(L, S, H, Fs, fan_in=Fs))]
        self.regions: list[tuple[int, int, torch.Tensor]] = []
        self.register(self.host)
        self.register(self.hbm)
        self.host_lo = self.host.data_ptr()
        self.host_hi = self.host_lo + L * E * nb

    def register(self, t: torch.Tensor) -> None:
        """Makes ``t``'s addresses resolvable by ``resolve``."""
        self.regions.append((t.data_ptr(), t.numel() * t.element_size(), t.view(-1).view(torch.uint8)))

    def unregister(self, t: torch.Tensor) -> None:
        self.regions = [r for r in self.regions if r[0] != t.data_ptr()]

    def resolve(self, addr: int) -> torch.Tensor:
        """The expert blob (``uint8 [bytes]``) at address ``addr`` of a registered tensor."""
        for base, size, flat in self.regions:
            if base <= addr and addr + self.nbytes <= base + size:
                return flat[addr - base: addr - base + self.nbytes]
        raise ValueError(f"address {addr:#x} lies in no registered tensor")

    def addr(self, where: str, layer, expert) -> int:
        t = self.host if where == "host" else self.hbm
        return t.data_ptr() + (layer * self.shape.experts + expert) * self.nbytes

    def table(self, where) -> torch.Tensor:
        """``int64 [L, E]`` addresses; ``where(layer, expert)`` says ``hbm``, ``host`` or ``None``
        (0: not on the GPU)."""
        L, E = self.shape.layers, self.shape.experts
        t = [[0] * E for _ in range(L)]
        for layer in range(L):
            for e in range(E):
                w = where(layer, e)
                if w is not None:
                    t[layer][e] = self.addr(w, layer, e)
        return torch.tensor(t, dtype=torch.int64, device=self.device)

    def unpin(self) -> None:
        """Ends this script's registration of the host copy (a tierkit bank then registers it
        for its life: tierkit refuses memory registered by someone else that ``is_pinned()`` does
        not report)."""
        if self.registered:
            torch.cuda.synchronize(self.device)
            torch.cuda.check_error(torch.cuda.cudart().cudaHostUnregister(self.host.data_ptr()))
            self.registered = False

    def repin(self) -> None:
        if not self.registered and self.device.type == "cuda" and not self.host.is_pinned():
            torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(
                self.host.data_ptr(), self.host.numel(), 3))
            self.registered = True

    def close(self) -> None:
        self.unpin()


def expert_views(blob: torch.Tensor, hidden: int, ffn: int):
    """(gate+up ``[2F, H]``, down ``[H, F]``) bf16 views of one expert blob."""
    w = blob.view(BF16)
    return w[: 2 * ffn * hidden].view(2 * ffn, hidden), w[2 * ffn * hidden:].view(hidden, ffn)


def rms(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(BF16)


def swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One expert's FFN in the input's dtype (torch: cuBLAS on the GPU, oneDNN on the CPU)."""
    g, u = F.linear(x, w13).chunk(2, dim=-1)
    return F.linear(F.silu(g) * u, w2)
