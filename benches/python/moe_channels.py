"""Do the link and the CPU add up? The three ways a cold expert's weights can be used, measured alone
and at the same time on one GPU machine (issue 27, step 1):

- **in place**: the GPU's GEMMs read the expert from mapped pinned host memory over PCIe / C2C (a
  CUDA view of the host copy, ``tierkit.torch.ExpertBank(...).host``), as tierkit's cold experts are;
- **copy**: the expert is copied host -> HBM on a side stream (a swap, or copy-on-miss);
- **CPU**: the CPU computes the expert's FFN from the same host memory (KTransformers' cold path,
  llama.cpp's ``--n-cpu-moe``), torch on every core.

Each channel works on its own experts (no expert is read by two channels), bf16, expert shapes of a
named model (Mixtral-8x7B by default: gate+up ``[2 × 14336, 4096]`` and down ``[4096, 14336]``,
352 MB), decode batch ``--batch`` tokens. Printed: one JSON line with each channel's bytes/s alone
and in every combination, the sum of the concurrent rates, and that sum over the sum of the solo
rates (1.0 = independent channels; below 1: they share something, the host DRAM for one).

    python benches/python/moe_channels.py [--shape mixtral|qwen3|olmoe] [--batch 1] [--experts 6]
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch
import torch.nn.functional as F

SHAPES = {  # hidden, FFN width of one expert
    "mixtral": (4096, 14336),
    "qwen3": (2048, 768),
    "olmoe": (2048, 1024),
}


def ffn(x, blob, hidden, inter):
    """One expert's SwiGLU FFN on ``x [batch, hidden]`` with weights in ``blob`` (bf16: gate+up
    ``[2 × inter, hidden]`` then down ``[hidden, inter]``), wherever ``blob`` lives."""
    w13 = blob[: 2 * inter * hidden].view(2 * inter, hidden)
    w2 = blob[2 * inter * hidden :].view(hidden, inter)
    h = x @ w13.t()
    g, u = h.chunk(2, dim=-1)
    return (F.silu(g) * u) @ w2.t()


class Channels:
    def __init__(self, hidden, inter, experts, batch, device):
        from tierkit import experts as ex
        import tierkit.torch as tt

        self.hidden, self.inter, self.batch = hidden, inter, batch
        self.elems = 3 * hidden * inter
        self.nbytes = 2 * self.elems
        self.n = experts  # experts per channel
        total = 3 * experts
        # One host copy (pinned by tierkit, mapped for the GPU): channel c's experts are
        # c * n .. (c + 1) * n, never read by another channel.
        host = torch.empty(total * self.elems, dtype=torch.bfloat16).pin_memory()
        host.normal_(0, 0.02)
        g = ex.Geometry(1, total, 1, self.nbytes)
        self.bank = tt.ExpertBank(ex.ResidencyMap.first_k("channels", g), device=device, host=host)
        self.host_cpu = host.view(total, self.elems)  # the CPU's view of the same bytes
        self.host_gpu = self.bank.host[0].view(torch.bfloat16).view(total, self.elems)
        self.hbm = torch.empty((experts, self.elems), dtype=torch.bfloat16, device=device)
        self.x_gpu = torch.randn(batch, hidden, dtype=torch.bfloat16, device=device)
        self.x_cpu = self.x_gpu.cpu()
        self.s_inplace = torch.cuda.Stream(device)
        self.s_copy = torch.cuda.Stream(device)

    def inplace(self):
        with torch.cuda.stream(self.s_inplace):
            for e in range(self.n):
                ffn(self.x_gpu, self.host_gpu[e], self.hidden, self.inter)

    def copy(self):
        with torch.cuda.stream(self.s_copy):
            for e in range(self.n):
                self.hbm[e].copy_(self.host_cpu[self.n + e], non_blocking=True)

    def cpu(self):
        for e in range(self.n):
            ffn(self.x_cpu, self.host_cpu[2 * self.n + e], self.hidden, self.inter)

    def run(self, which):
        """Runs the named channels at once; returns each one's seconds (its own end)."""
        ends = {}
        t0 = time.perf_counter()
        threads = []
        if "cpu" in which:
            def cpu_job():
                self.cpu()
                ends["cpu"] = time.perf_counter() - t0
            threads.append(threading.Thread(target=cpu_job))
            threads[-1].start()
        if "inplace" in which:
            self.inplace()
        if "copy" in which:
            self.copy()
        for name, s in (("inplace", self.s_inplace), ("copy", self.s_copy)):
            if name in which:
                s.synchronize()
                ends[name] = time.perf_counter() - t0
        for t in threads:
            t.join()
        return ends


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="mixtral")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--experts", type=int, default=6, help="experts per channel and run")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per combination (median)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return
    hidden, inter = SHAPES[a.shape]
    dev = torch.device("cuda", 0)
    ch = Channels(hidden, inter, a.experts, a.batch, dev)
    combos = [("inplace",), ("copy",), ("cpu",), ("inplace", "cpu"), ("inplace", "copy"),
              ("copy", "cpu"), ("inplace", "copy", "cpu")]
    for combo in combos:  # warm-up (cuBLAS handles, CPU thread pools)
        ch.run(combo)
    gbs = {}
    for combo in combos:
        runs = [ch.run(combo) for _ in range(a.reps)]
        rates = {}
        for name in combo:
            secs = sorted(r[name] for r in runs)[len(runs) // 2]
            rates[name] = ch.n * ch.nbytes / secs / 1e9
        gbs["+".join(combo)] = rates
    solo = {name: gbs[name][name] for name in ("inplace", "copy", "cpu")}
    out = {"shape": a.shape, "hidden": hidden, "inter": inter, "expert_mb": ch.nbytes / 1e6,
           "batch": a.batch, "experts_per_channel": a.experts, "threads": torch.get_num_threads(),
           "device": torch.cuda.get_device_name(0), "gb_per_s": gbs, "combined": {}}
    for key, rates in gbs.items():
        if len(rates) > 1:
            total = sum(rates.values())
            out["combined"][key] = {"sum_gb_per_s": round(total, 1),
                                    "vs_sum_of_solo": round(total / sum(solo[n] for n in rates), 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
