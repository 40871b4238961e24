"""Model shapes and routing of the MoE decode bench (``moe_decode.py``; issue 27): the named
shapes, the routing trace (``--trace`` or the lab's generator), the batch composed from a trace's
streams and how correlated it is."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@dataclass(frozen=True)
class Shape:
    """A MoE model's decode shapes. ``q_dim``/``kv_dim``: attention projection widths (QKV is
    ``[q + 2·kv + gate, hidden]``, O is ``[hidden, q]``); ``shared``: shared experts of width
    ``shared_ffn`` (in HBM, every token); ``trace``: default routing source (``mixtral`` = the
    Mixtral decode logs, ``olmoe`` = the OLMoE calibrated generator, ``zipf`` = Zipf popularity
    with exponent ``zipf``); ``reuse``: previous-step reuse of generated traces."""

    name: str
    layers: int
    experts: int
    top_k: int
    hidden: int
    ffn: int
    q_dim: int
    kv_dim: int
    gate_dim: int = 0
    shared: int = 0
    shared_ffn: int = 0
    trace: str = "zipf"
    zipf: float = 0.5
    reuse: float = 0.37

    @property
    def expert_bytes(self) -> int:
        return 2 * 3 * self.hidden * self.ffn

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim + self.gate_dim

    def summary(self) -> dict:
        d = asdict(self)
        d["expert_mb"] = round(self.expert_bytes / 1e6, 2)
        d["expert_gb_total"] = round(self.expert_bytes * self.layers * self.experts / 1e9, 2)
        d["dense_mb_per_layer"] = round(
            2 * self.hidden * (self.qkv_dim + self.q_dim + self.experts) / 1e6, 1)
        return d


SHAPES = {
    # Mixtral-8x7B: 32 heads × 128, 8 KV heads; routing from the real decode logs.
    "mixtral": Shape("mixtral", 32, 8, 2, 4096, 14336, 4096, 1024, trace="mixtral", zipf=0.1),
    # OLMoE-1B-7B: 16 heads × 128 (no GQA); routing from the OLMoE-calibrated generator.
    "olmoe": Shape("olmoe", 16, 64, 8, 2048, 1024, 2048, 2048, trace="olmoe"),
    # Qwen3-30B-A3B: 32 heads × 128, 4 KV heads; no public per-token trace: Zipf 0.5 (weak skew,
    # the model trains with global-batch load balancing), Mixtral's reuse 0.37.
    "qwen3": Shape("qwen3", 48, 128, 8, 2048, 768, 4096, 512, trace="zipf", zipf=0.5),
    # 512 experts top-10 at Qwen3-Next-80B-A3B's widths (hidden 2048, expert FFN 512, one shared
    # expert of 512; gated attention 16 × 256 plus its gate, 2 KV heads × 256), routing the lab's
    # wide-reuse scenario (Zipf 0.5, reuse 0.6). 24 layers, not 48: the experts (77 GB) fit HBM
    # beside a 75% bank (58 GB) on the 141 GB H200, and the pinned host copy fits its 128 GiB host.
    "e512": Shape("e512", 24, 512, 10, 2048, 512, 4096, 512, gate_dim=4096, shared=1,
                  shared_ffn=512, trace="zipf", zipf=0.5, reuse=0.6),
}


# ----------------------------------------------------------------------------------- routing


def trace_path(shape: Shape, traces) -> str | None:
    """The ``--trace`` for ``shape``: a ``SHAPE=PATH`` entry naming it, else a plain path."""
    plain = None
    for t in traces or []:
        name, sep, rest = t.partition("=")
        if sep and (name in SHAPES or name == "custom"):
            if name == shape.name:
                return rest
        else:
            plain = t
    return plain


def load_trace(shape: Shape, args, tokens: int, steps: int) -> dict:
    """The routing trace for ``shape``: ``--trace`` (any format the replay CLI reads), else the
    shape's default source; a generated one has ``tokens`` streams and ``steps`` steps."""
    from tierkit import sim

    path = trace_path(shape, args.trace)
    if path is None and shape.trace == "mixtral":
        default = os.path.join(REPO, "..", "shared", "data", "moe", "mixtral-decode")
        if os.path.isdir(default):
            path = default
        else:
            print(f"NOTE: no Mixtral trace at {default} (pass --trace): Zipf {shape.zipf} "
                  f"routing generated instead", file=sys.stderr)
    if path is not None:
        t = sim.trace_ids(path)
        t["source"] = f"trace {path}"
    elif shape.trace == "olmoe" and shape.experts == 64 and shape.top_k == 8:
        t = sim.synth_ids(steps=steps, tokens_per_step=tokens, reuse=shape.reuse, seed=args.seed)
        t["source"] = "lab generator: OLMoE github popularity (routing counts), reuse %.2f" % shape.reuse
    else:
        t = sim.synth_ids(steps=steps, tokens_per_step=tokens,
                          shape=(shape.layers, shape.experts, shape.top_k), zipf=shape.zipf,
                          reuse=shape.reuse, seed=args.seed)
        t["source"] = "lab generator: Zipf %.2f popularity, reuse %.2f" % (shape.zipf, shape.reuse)
    if t["experts_per_layer"] != shape.experts or t["top_k"] != shape.top_k:
        raise SystemExit(f"trace {t['name']} is {t['experts_per_layer']} experts top-"
                         f"{t['top_k']}, shape {shape.name} is {shape.experts} top-{shape.top_k}")
    if t["layers"] < shape.layers:
        raise SystemExit(f"trace {t['name']} has {t['layers']} layers, shape {shape.name} "
                         f"{shape.layers}: pass --layers {t['layers']} or fewer")
    return t


def compose_batch(ids: np.ndarray, batch: int, steps: int) -> tuple[np.ndarray, dict]:
    """``ids int32 [S, L, T, k]`` (a trace) → ``int64 [steps, L, batch, k]``: row ``b`` follows
    stream ``b mod T`` from step ``(b div T) × stride`` (``stride = S div ceil(batch / T)``),
    wrapping at the trace's end. A missing row (a ``-1``; the Mixtral logs lack a few (token,
    layer) rows) takes the row's previous step's ids (``0..k-1`` at its first step)."""
    S, L, T, k = ids.shape
    copies = -(-batch // T)
    stride = max(S // copies, 1)
    out = np.empty((steps, L, batch, k), dtype=np.int64)
    for b in range(batch):
        t, off = b % T, (b // T) * stride
        out[:, :, b, :] = ids[(off + np.arange(steps)) % S, :, t, :]
    for s in range(steps):
        bad = (out[s] < 0).any(axis=-1)  # [L, batch]
        if bad.any():
            out[s][bad] = out[s - 1][bad] if s > 0 else np.arange(k)
    info = {"streams": T, "trace_steps": S, "stride": stride if copies > 1 else 0,
            "rows_per_stream": copies, "wraps": steps > S - (copies - 1) * stride}
    return out, info


def touched(ids: np.ndarray, experts: int) -> float:
    """Mean distinct experts per (step, layer) of ``ids [steps, L, B, k]``."""
    n, L = ids.shape[:2]
    m = np.zeros((n, L, experts), dtype=bool)
    np.put_along_axis(m, ids.reshape(n, L, -1), True, axis=2)
    return float(m.sum(axis=2).mean())


def correlation(trace: np.ndarray, batch_ids: np.ndarray, experts: int, seed: int) -> dict:
    """How correlated the composed batch is: its mean touched experts per layer against a batch
    of the same size whose rows are independent (each row at a random step and stream)."""
    S, L, T, k = trace.shape
    n = min(len(batch_ids), 64)
    rng = np.random.default_rng(seed)
    B = batch_ids.shape[2]
    ind = trace[rng.integers(0, S, (n, B)), :, rng.integers(0, T, (n, B)), :]  # [n, B, L, k]
    ind = np.where(ind < 0, np.arange(k), ind).transpose(0, 2, 1, 3)
    return {"touched_per_layer": round(touched(batch_ids[:n], experts), 2),
            "touched_independent_rows": round(touched(ind, experts), 2)}
