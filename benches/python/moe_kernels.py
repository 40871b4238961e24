"""The MoE kernels of the decode bench (``moe_decode.py``; issue 27): two Triton kernels reading
each expert's weights through a per-layer table of addresses, the float32 torch reference of the
same contract, the fixed-grid row copy kernel and the device-side LRU planner (torch ops,
capturable) that ``shared-bank`` and tierkit's copy-on-miss use."""

from __future__ import annotations

import os

import numpy as np
import torch

from moe_shapes import Shape
from moe_weights import BF16, Model, expert_views

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU reference path needs no Triton
    triton = None

# Triton's CPU interpreter (TRITON_INTERPRET=1, the kernels' test here) computes a bf16 tl.dot
# wrongly: there the operands are widened to float32 first (same products, exact in float32).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

if triton is not None:

    @triton.jit
    def _dot(a, b, acc, WIDEN: tl.constexpr):
        if WIDEN:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
        return tl.dot(a, b, acc)

    @triton.jit
    def _active(slot_e_ptr, slot_start_ptr, slot_cnt_ptr, table_ptr):
        """This program's active expert (axis 1): its weights' address (0: no expert in this
        slot, or the table says not on the GPU) and its pairs' range in sorted order."""
        a = tl.program_id(1)
        e = tl.load(slot_e_ptr + a)
        addr = tl.load(table_ptr + tl.maximum(e, 0))
        addr = tl.where(e < 0, 0, addr)
        return addr, tl.load(slot_start_ptr + a), tl.load(slot_cnt_ptr + a)

    @triton.jit
    def _moe_gate_up(x_ptr, table_ptr, act_ptr, slot_e_ptr, slot_start_ptr, slot_cnt_ptr,
                     pair_tok_ptr, kfrom_ptr, H, Fw, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, WIDEN: tl.constexpr, SPLIT: tl.constexpr):
        """act[pair, n-tile] = silu(x W_gate^T) * (x W_up^T) for the pairs of one active expert,
        its weights at ``table[e]`` (0: skipped); under ``SPLIT`` only the tiles at or past
        ``kfrom[e]`` (a multiple of the tile width)."""
        pid_n = tl.program_id(0)
        addr, start, cnt = _active(slot_e_ptr, slot_start_ptr, slot_cnt_ptr, table_ptr)
        if addr == 0:
            return
        if SPLIT:  # the CPU computes columns [0, kfrom[e]): whole tiles of them skipped
            e = tl.maximum(tl.load(slot_e_ptr + tl.program_id(1)), 0)
            if pid_n * BN < tl.load(kfrom_ptr + e):
                return
        w = addr.to(tl.pointer_type(tl.bfloat16))
        rows = tl.arange(0, BM)
        rmask = rows < cnt
        tok = tl.load(pair_tok_ptr + start + rows, mask=rmask, other=0)
        cols = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
        cmask = cols < Fw
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, H, BK):
            ks = k0 + tl.arange(0, BK)
            kmask = ks < H
            xt = tl.load(x_ptr + tok[:, None] * H + ks[None, :],
                         mask=rmask[:, None] & kmask[None, :], other=0.0)
            wmask = kmask[:, None] & cmask[None, :]
            wg = tl.load(w + cols[None, :] * H + ks[:, None], mask=wmask, other=0.0)
            wu = tl.load(w + (cols[None, :] + Fw) * H + ks[:, None], mask=wmask, other=0.0)
            acc_g = _dot(xt, wg, acc_g, WIDEN)
            acc_u = _dot(xt, wu, acc_u, WIDEN)
        act = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        dst = act_ptr + (start + rows).to(tl.int64)[:, None] * Fw + cols[None, :]
        tl.store(dst, act.to(tl.bfloat16), mask=rmask[:, None] & cmask[None, :])

    @triton.jit
    def _moe_down(act_ptr, table_ptr, out_ptr, slot_e_ptr, slot_start_ptr, slot_cnt_ptr,
                  pair_id_ptr, pair_w_ptr, kfrom_ptr, H, Fw, down_off, BM: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, WIDEN: tl.constexpr, SPLIT: tl.constexpr):
        """out[pair, n-tile] = (act W_down^T) × routing weight (float32), one active expert;
        under ``SPLIT`` the reduction runs over FFN columns ``[kfrom[e], F)`` only."""
        pid_n = tl.program_id(0)
        addr, start, cnt = _active(slot_e_ptr, slot_start_ptr, slot_cnt_ptr, table_ptr)
        if addr == 0:
            return
        k_lo = 0
        if SPLIT:  # the CPU computes columns [0, kfrom[e])
            e = tl.maximum(tl.load(slot_e_ptr + tl.program_id(1)), 0)
            k_lo = tl.load(kfrom_ptr + e).to(tl.int32)  # the loop's bounds in one type
        w = addr.to(tl.pointer_type(tl.bfloat16)) + down_off
        rows = tl.arange(0, BM)
        rmask = rows < cnt
        cols = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
        cmask = cols < H
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        arow = (start + rows).to(tl.int64)
        for k0 in range(k_lo, Fw, BK):
            ks = k0 + tl.arange(0, BK)
            kmask = ks < Fw
            at = tl.load(act_ptr + arow[:, None] * Fw + ks[None, :],
                         mask=rmask[:, None] & kmask[None, :], other=0.0)
            wt = tl.load(w + cols[None, :] * Fw + ks[:, None],
                         mask=kmask[:, None] & cmask[None, :], other=0.0)
            acc = _dot(at, wt, acc, WIDEN)
        pw = tl.load(pair_w_ptr + start + rows, mask=rmask, other=0.0)
        pid = tl.load(pair_id_ptr + start + rows, mask=rmask, other=0)
        dst = out_ptr + pid[:, None] * H + cols[None, :]
        tl.store(dst, acc * pw[:, None], mask=rmask[:, None] & cmask[None, :])

    @triton.jit
    def _copy_rows(src_ptr, dst_ptr, ok_ptr, n_words, BLOCK: tl.constexpr, PROGS: tl.constexpr):
        """Copies ``n_words`` int64 words from ``src[i]`` to ``dst[i]`` (addresses) where
        ``ok[i]``; a fixed grid ``(PROGS, rows)``, idle programs return at once."""
        c = tl.program_id(0)
        i = tl.program_id(1)
        if tl.load(ok_ptr + i) == 0:
            return
        src = tl.load(src_ptr + i).to(tl.pointer_type(tl.int64))
        dst = tl.load(dst_ptr + i).to(tl.pointer_type(tl.int64))
        for off in range(c * BLOCK, n_words, PROGS * BLOCK):
            idx = off + tl.arange(0, BLOCK)
            m = idx < n_words
            tl.store(dst + idx, tl.load(src + idx, mask=m), mask=m)


# tierkit's split mode cuts an expert's FFN columns at multiples of this (every kernel tile
# width divides it)
SPLIT_ALIGN = 64


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# ----------------------------------------------------------------------------------- the step


def align(ids_l: torch.Tensor, experts: int):
    """The pairs of one layer (``ids_l int64 [B, k]``) grouped by expert with torch ops (no host
    sync: capturable). Returns ``slot_e [A]`` (active experts ascending, -1 padding; ``A =
    min(E, B·k)``), ``slot_start``, ``slot_cnt`` (their pair ranges in sorted order), ``pair_id``
    (sorted position → pair ``b·k + j``) and ``pair_tok`` (→ token ``b``)."""
    flat = ids_l.reshape(-1)
    P = flat.numel()
    A = min(experts, P)
    sorted_e, order = torch.sort(flat, stable=True)
    first = torch.ones(P, dtype=torch.bool, device=flat.device)
    first[1:] = sorted_e[1:] != sorted_e[:-1]
    slot = torch.cumsum(first, 0, dtype=torch.int64) - 1
    slot_e = torch.full((A,), -1, dtype=torch.int64, device=flat.device).scatter_(0, slot, sorted_e)
    pos = torch.arange(P, dtype=torch.int64, device=flat.device)
    slot_start = torch.full((A,), P, dtype=torch.int64, device=flat.device).scatter_reduce_(
        0, slot, pos, "amin")
    slot_cnt = torch.zeros(A, dtype=torch.int64, device=flat.device).scatter_add_(
        0, slot, torch.ones_like(pos))
    return slot_e, slot_start, slot_cnt, order, order // ids_l.shape[1]


class Buffers:
    """Per-engine scratch of the MoE layer (reused by every layer, sequential on one stream)."""

    def __init__(self, shape: Shape, batch: int, device):
        P = batch * shape.top_k
        self.act = torch.zeros((P, shape.ffn), dtype=BF16, device=device)
        self.out_pairs = torch.zeros((P, shape.hidden), dtype=torch.float32, device=device)


def moe_triton(model: Model, xn, w, ids_l, table_l, bufs: Buffers, kfrom=None) -> torch.Tensor:
    """The MoE layer's pairs ``float32 [B·k, H]`` (weighted expert outputs; pairs whose expert
    has table address 0 stay zero) by the two Triton kernels. ``kfrom`` (``int64 [E]``, multiples
    of ``SPLIT_ALIGN``, or None): the GPU computes expert ``e``'s FFN columns ``[kfrom[e], F)``
    only (the CPU adds the rest: tierkit's ``split`` mode)."""
    s = model.shape
    slot_e, slot_start, slot_cnt, pair_id, pair_tok = align(ids_l, s.experts)
    pw = w.reshape(-1).index_select(0, pair_id)
    bufs.out_pairs.zero_()
    A = slot_e.numel()
    B = xn.shape[0]
    BM = max(16, next_pow2(B))  # one row block per expert: an expert has at most B pairs
    BN1, BN2, BK = (64, 64, 64) if BM <= 32 else (32, 32, 64)
    warps = 4 if BM <= 64 else 8
    split = kfrom is not None
    kf = kfrom if split else slot_e  # never read without SPLIT
    _moe_gate_up[(triton.cdiv(s.ffn, BN1), A)](
        xn, table_l, bufs.act, slot_e, slot_start, slot_cnt, pair_tok, kf, s.hidden, s.ffn,
        BM=BM, BN=BN1, BK=BK, WIDEN=INTERPRETED, SPLIT=split, num_warps=warps, num_stages=3)
    _moe_down[(triton.cdiv(s.hidden, BN2), A)](
        bufs.act, table_l, bufs.out_pairs, slot_e, slot_start, slot_cnt, pair_id, pw, kf,
        s.hidden, s.ffn, 2 * s.ffn * s.hidden, BM=BM, BN=BN2, BK=BK, WIDEN=INTERPRETED,
        SPLIT=split, num_warps=warps, num_stages=3)
    return bufs.out_pairs


def moe_reference(model: Model, xn, w, ids_l, table_l, bufs: Buffers, kfrom=None) -> torch.Tensor:
    """The same contract as ``moe_triton`` in float32 torch (any device): weights read through
    the table's addresses (``Model.resolve``), gate+up activations rounded to bf16 as the kernel
    stores them; with ``kfrom``, expert ``e``'s FFN columns ``[kfrom[e], F)`` only."""
    s = model.shape
    k = ids_l.shape[1]
    ids = ids_l.cpu().numpy()
    tab = table_l.cpu().tolist()
    lo = [0] * s.experts if kfrom is None else kfrom.cpu().tolist()
    out = bufs.out_pairs
    out.zero_()
    for e in np.unique(ids):
        if tab[e] == 0 or lo[e] >= s.ffn:
            continue
        rows, js = np.nonzero(ids == e)
        w13, w2 = expert_views(model.resolve(tab[e]).to(xn.device), s.hidden, s.ffn)
        cols = torch.arange(lo[e], s.ffn, device=xn.device)
        w13 = w13[torch.cat([cols, cols + s.ffn])]
        r = torch.as_tensor(rows, device=xn.device)
        h = xn[r].float() @ w13.float().t()
        g, u = h.chunk(2, dim=-1)
        act = (g * torch.sigmoid(g) * u).to(BF16).float()
        pairs = torch.as_tensor(rows * k + js, device=xn.device)
        rw = w[r, torch.as_tensor(js, device=xn.device)][:, None]
        out[pairs] = (act @ w2[:, lo[e]:].float().t()) * rw
    return out


def copy_rows_torch(model: Model, src, dst, ok) -> None:
    """``_copy_rows`` on any device: blob copies between registered tensors (host-side loop)."""
    for a, b, o in zip(src.tolist(), dst.tolist(), ok.tolist()):
        if o:
            model.resolve(b).copy_(model.resolve(a))


def lru_plan(remap, rows_l, owner, last, now, hit, miss, M, base, sentinel, ar, cond=None):
    """One layer of a device-side LRU planner (torch ops, capturable; ``shared-bank`` and
    tierkit's ``copy-on-miss`` staging). ``rows_l int64 [E]``: the layer's view of ``remap``
    (its row or -1); ``owner`` / ``last`` ``int64 [R + 1]``: each row's id in ``remap`` and
    last-use stamp (index ``R`` a sentinel); ``hit`` / ``miss`` ``bool [E]``; ``now`` the stamp
    (``int64 [1]``). Hits are stamped, then up to ``M`` misses (lowest id first) take the least
    recently used rows not stamped ``now`` (and where ``cond``). Returns ``(gid, victim, ok)``:
    ids ``base + expert`` in ``remap``, rows, and which of the ``M`` pairs to copy."""
    R, E = last.numel() - 1, rows_l.numel()
    last.scatter_(0, torch.where(hit, rows_l, R), now.expand(E))
    miss_e = torch.argsort(torch.where(miss, ar, ar + E), stable=True)[:M]
    victim = torch.argsort(last[:R], stable=True)[:M]
    ok = miss.gather(0, miss_e) & (last.gather(0, victim) < now)
    if cond is not None:
        ok = ok & cond
    old = owner.gather(0, victim)
    remap.scatter_(0, torch.where(ok & (old >= 0), old, sentinel), -1)
    gid = base + miss_e
    remap.scatter_(0, torch.where(ok, gid, sentinel), victim)
    owner.scatter_(0, torch.where(ok, victim, R), gid)
    last.scatter_(0, torch.where(ok, victim, R), now.expand(M))
    return gid, victim, ok


def copy_planned(step, model: Model, src, dst, ok, M: int) -> torch.Tensor:
    """Copies the planned blobs (``src``/``dst`` ``int64 [M]`` addresses where ``ok``): the
    fixed-grid Triton kernel, or ``copy_rows_torch``. Returns the count (``int64`` device)."""
    okw = ok.to(torch.int32)
    if step.use_triton:
        nb = model.shape.expert_bytes
        _copy_rows[(64, M)](src, dst, okw, nb // 8, BLOCK=512, PROGS=64, num_warps=4)
    else:
        copy_rows_torch(model, src, dst, okw)
    return okw.sum()
