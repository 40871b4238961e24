"""A sparse-attention decode in torch whose KV lives in tierkit's elastic pool, inside a CUDA graph.

Each decode step, for a batch of sessions: an indexer scores every history position (small
per-token index keys kept in HBM, as DeepSeek's lightning indexer), takes the top-k positions,
``KvPool.resolve`` maps them to arena rows (hot cache, tail, lent pages, or fetched from the
mapped host store on a miss, all on the GPU), and attention gathers the resolved arena rows
(MLA-style: one latent row per token, ``bf16 [D]``; K = the latent, V = its first ``DV`` dims).
The whole step (indexer, top-k, resolve, gather, attention) is one captured CUDA graph, replayed
with new inputs; per-step sizes (sequence lengths, session slots) live in device tensors.

The reference is the same decode with the whole history resident in HBM (gathering the top-k
positions straight from it), captured in the same graph. Between replays sessions append their
new token, finish, get admitted, and lent pages are reclaimed, so resolves see hits, misses,
borrowed pages and tails. Checked: the tierkit output is bit-identical to the reference at every
step, and the pool's device error words stay zero. Prints one JSON line; exit 0 only if it held.

    python examples/python/kv_sparse_decode.py [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import tierkit.torch as tt
from tierkit import kv

D, DV, DI = 256, 128, 32  # latent dims, value dims, indexer key dims


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--topk", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--budget-mib", type=float, default=2.0,
                    help="HBM budget of the arena (below the batch's history, so some of it misses)")
    ap.add_argument("--max-history", type=int, default=4096)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device"}))
        return 1
    dev = torch.device("cuda", torch.cuda.current_device())
    B, H, K, MH = args.batch, args.heads, args.topk, args.max_history
    row_bytes = D * 2
    g = kv.Geometry.for_hbm_budget(int(args.budget_mib * 2**20), row_bytes, 1, 16, 2 * K, 16)
    pool = tt.KvPool(g, max_sessions=2 * B, max_history=MH, device=dev)
    tt.warmup(dev)
    gen = torch.Generator().manual_seed(0)

    # device state of the batch (fixed shapes: the graph's inputs)
    full_kv = torch.zeros((B, MH, D), dtype=torch.bfloat16, device=dev)  # the reference's HBM
    keys = torch.zeros((B, MH, DI), dtype=torch.bfloat16, device=dev)  # indexer keys (HBM)
    q = torch.zeros((B, H, D), dtype=torch.bfloat16, device=dev)
    q_idx = torch.zeros((B, DI), dtype=torch.bfloat16, device=dev)
    seq = torch.zeros(B, dtype=torch.int32, device=dev)
    slot = torch.zeros(B, dtype=torch.int32, device=dev)
    qsl = torch.arange(B + 1, dtype=torch.int32, device=dev)
    indices = torch.full((B * K,), -1, dtype=torch.int32, device=dev)
    valid = torch.zeros(B, dtype=torch.int32, device=dev)
    out_ref = torch.zeros((B, H, DV), dtype=torch.bfloat16, device=dev)
    out_tk = torch.zeros((B, H, DV), dtype=torch.bfloat16, device=dev)
    pos = torch.arange(MH, device=dev)
    arena = pool.planes[0].view(torch.bfloat16)  # [arena_rows, D]
    scale = D ** -0.5

    def attend(rows_kv, mask, out):
        # rows_kv [B, K, D], mask [B, K] (True = a real pick)
        s = torch.einsum("bhd,bkd->bhk", q.float(), rows_kv.float()) * scale
        s = s.masked_fill(~mask[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        out.copy_(torch.einsum("bhk,bkd->bhd", p, rows_kv[..., :DV].float()).to(out.dtype))

    def step():
        # indexer: score every visible position, keep the top-k (-1 where fewer exist)
        sc = torch.einsum("bd,btd->bt", q_idx.float(), keys.float())
        sc = sc.masked_fill(pos[None, :] >= seq[:, None], float("-inf"))
        val, top = torch.topk(sc, K, dim=-1)
        top = torch.where(torch.isinf(val), torch.full_like(top, -1), top).to(torch.int32)
        # reference: the whole history resident
        safe = top.clamp(min=0).long()
        ref_rows = torch.gather(full_kv, 1, safe[..., None].expand(B, K, D))
        attend(ref_rows, top >= 0, out_ref)
        # tierkit: resolve the picks to arena rows, gather them
        pool.resolve(top, qsl, seq, slot, indices, valid, layer=0)
        idx = indices.view(B, K)
        tk_rows = arena[idx.clamp(min=0).long()]
        attend(tk_rows, idx >= 0, out_tk)

    next_session = [1]

    def new_session(b: int, length: int):
        s = next_session[0]
        next_session[0] += 1
        lat = torch.randn((length, D), generator=gen).to(torch.bfloat16)
        ik = torch.randn((length, DI), generator=gen).to(torch.bfloat16)
        while True:
            a = pool.admit(s, lat.view(torch.uint8).numpy().reshape(-1))
            if a["admitted"]:
                break
            pool.between_steps(64)
        full_kv[b, :length].copy_(lat)
        keys[b, :length].copy_(ik)
        seq[b] = length
        slot[b] = pool.slot_of(s)
        return s

    lengths = [700 + 500 * b for b in range(B)]
    batch = [new_session(b, n) for b, n in enumerate(lengths)]

    def new_queries():
        q.copy_(torch.randn((B, H, D), generator=gen).to(torch.bfloat16))
        q_idx.copy_(torch.randn((B, DI), generator=gen).to(torch.bfloat16))

    # warm-up on a side stream, then capture the whole step
    new_queries()
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream(dev).wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    mismatches, admitted, finished, reclaimed = 0, 0, 0, 0
    misses = picks = 0
    t0 = time.perf_counter()
    for it in range(args.steps):
        new_queries()
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(out_ref, out_tk):
            mismatches += 1
        st = pool.stats.cpu().numpy()[:B]
        picks += int(st[:, 0].sum())
        misses += int(st[:, 5].sum())
        # between steps: every session appends its new token
        for b, s in enumerate(batch):
            n = int(seq[b])
            if n >= MH - 1:
                continue
            lat = torch.randn((1, D), generator=gen).to(torch.bfloat16)
            ik = torch.randn((1, DI), generator=gen).to(torch.bfloat16)
            pool.append(s, lat.view(torch.uint8).numpy().reshape(-1))
            full_kv[b, n].copy_(lat[0])
            keys[b, n].copy_(ik[0])
            seq[b] = n + 1
        if it % 40 == 39:  # a session leaves, a new one comes in its batch position
            b = (it // 40) % B
            pool.finish(batch[b])
            finished += 1
            pool.between_steps(64)
            batch[b] = new_session(b, 600 + 97 * it % 1500)
            admitted += 1
        if it % 25 == 12:  # take lent pages back (for an admission elsewhere), then regrow
            reclaimed += pool.reclaim(8)
        pool.between_steps(8)
    elapsed = time.perf_counter() - t0
    errors = pool.errors()
    ok = mismatches == 0 and all(v == 0 for v in errors.values()) and picks > 0 and misses > 0
    print(json.dumps({
        "ok": ok, "steps": args.steps, "batch": B, "heads": H, "topk": K,
        "arena_rows": pool.layout["arena_rows"], "mismatched_steps": mismatches,
        "picks": picks, "misses": misses, "miss_share": round(misses / max(picks, 1), 4),
        "admitted": admitted, "finished": finished, "pages_reclaimed": reclaimed,
        "device_errors": errors, "steps_per_s": round(args.steps / elapsed, 1),
    }))
    pool.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
