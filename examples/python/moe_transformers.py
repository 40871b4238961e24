"""A transformers MoE model whose experts are served through tierkit, on one GPU.

An OLMoE-class model (``OlmoeForCausalLM``, a small config with random weights: nothing is
downloaded) whose experts do not all fit the HBM budget: ``--hot`` experts per layer live in
tierkit's HBM slots, the rest are read in place from mapped pinned host memory by the expert
GEMMs. That host memory is the example's own pinned tensor (``ExpertBank(boot, host=weights)``):
one host copy of the weights, which the engine owns. The model's experts run through transformers' experts-implementation hook
(``ALL_EXPERTS_FUNCTIONS.register("tierkit", ...)`` + ``model.set_experts_implementation``),
which gets each layer's router top-k ids: they are counted on the GPU by
``torch.ops.tierkit.count_topk`` and, after every generated token, the controller drains the
counts and swaps experts live (``ExpertBank.step``).

Checked: greedy generation is token-identical to the all-HBM model (the same eager expert loop on
the model's own HBM weights) for every map (static first-K, a seed map fitted on a profiling run,
first-K with the adaptive controller). Printed: one JSON line with tok/s and the cold share (picks
served from host memory) of each run against all-HBM. Exit status 0 only if every run matched.

    python examples/python/moe_transformers.py [--tokens 64] [--hot 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from transformers import OlmoeConfig, OlmoeForCausalLM
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

import tierkit.torch as tt
from tierkit import experts


def expert_layout(model):
    """(intermediate, hidden, dtype) of the experts and the bytes of one expert blob
    (``gate_up_proj[e]`` then ``down_proj[e]``)."""
    ex = model.model.layers[0].mlp.experts
    two_i, h = ex.gate_up_proj.shape[1:]
    el = ex.gate_up_proj.element_size()
    return two_i // 2, h, ex.gate_up_proj.dtype, (two_i * h + h * two_i // 2) * el


class Serving:
    """What the tierkit experts forward needs: the bank, the device counters, the per-layer
    slot ids of the step, and the cold-share tally."""

    def __init__(self, model, bank: tt.ExpertBank, counters: tt.DeviceCounters):
        self.inter, self.hidden, self.dtype, self.nbytes = expert_layout(model)
        self.bank = bank
        self.counters = counters
        self.slot_ids = None  # host copy, per step
        self._slot_dev = None  # the op's persistent output
        self.picks = 0
        self.cold = 0
        # all-HBM mode: the same loop over the model's own HBM weights (the speed ceiling)
        self.hbm = [layer.mlp.experts for layer in model.model.layers]
        self.all_hbm = False

    def refresh(self):
        """The slot-id form of the table, once per step, after the controller's flips."""
        self._slot_dev = self.bank.slot_ids(self._slot_dev)
        self.slot_ids = self._slot_dev.cpu().tolist()

    def weights(self, layer: int, expert: int):
        if self.all_hbm:
            ex = self.hbm[layer]
            return ex.gate_up_proj[expert], ex.down_proj[expert], False
        s = self.slot_ids[layer][expert]
        blob = self.bank.slots[layer, s] if s >= 0 else self.bank.host[layer, expert]
        w = blob.view(self.dtype)
        i, h = self.inter, self.hidden
        return w[: 2 * i * h].view(2 * i, h), w[2 * i * h :].view(h, i), s < 0


def tierkit_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' eager expert loop (``OlmoeExperts.forward``), each expert's weights read
    where tierkit's table says: an HBM slot, or the host copy in place."""
    srv: Serving = self._tierkit
    layer = self._tierkit_layer
    srv.counters.record(layer, top_k_index)  # the router's top-k, counted on the GPU
    final_hidden_states = torch.zeros_like(hidden_states)
    with torch.no_grad():
        expert_mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts)
        expert_mask = expert_mask.permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
    for expert_idx in expert_hit:
        expert_idx = expert_idx[0]
        if expert_idx == self.num_experts:
            continue
        top_k_pos, token_idx = torch.where(expert_mask[expert_idx])
        gate_up, down, cold = srv.weights(layer, int(expert_idx))
        srv.picks += token_idx.numel()
        srv.cold += token_idx.numel() if cold else 0
        current_state = hidden_states[token_idx]
        gate, up = F.linear(current_state, gate_up).chunk(2, dim=-1)
        current_hidden_states = self.act_fn(gate) * up
        current_hidden_states = F.linear(current_hidden_states, down)
        current_hidden_states = current_hidden_states * top_k_weights[token_idx, top_k_pos, None]
        final_hidden_states.index_add_(0, token_idx, current_hidden_states.to(final_hidden_states.dtype))
    return final_hidden_states


ALL_EXPERTS_FUNCTIONS.register("tierkit", tierkit_experts_forward)


@torch.no_grad()
def greedy(model, prompt, tokens, between=None):
    """Greedy decode of ``tokens`` tokens; ``between()`` runs after each one (the controller)."""
    out = model(input_ids=prompt, use_cache=True)
    cache = out.past_key_values
    ids = []
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(tokens):
        ids.append(int(nxt))
        if between is not None:
            between()
        out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    torch.cuda.synchronize()
    return ids, tokens / (time.perf_counter() - t0)


@torch.no_grad()
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--hot", type=int, default=4, help="HBM slots per layer (the budget)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    ap.add_argument("--prompt", type=int, default=32)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "error": "no CUDA device"}))
        return 1

    torch.manual_seed(0)
    cfg = OlmoeConfig(
        vocab_size=1024, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8,
        num_experts=args.experts, num_experts_per_tok=args.top_k, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = OlmoeForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    # the router's random init is near-uniform; a wider spread gives the routing some skew
    for layer in model.model.layers:
        layer.mlp.gate.weight.mul_(40.0)
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt), device="cuda")
    inter, hidden, dtype, nbytes = expert_layout(model)
    g = experts.Geometry(args.layers, args.experts, args.hot, nbytes)

    # token reference: transformers' own eager experts on the model's HBM weights
    model.set_experts_implementation("eager")
    greedy(model, prompt, 8)  # warm-up (CUDA context, cuBLAS handles, allocator) before timing
    ref, eager_tps = greedy(model, prompt, args.tokens)

    # the engine's one host copy of the experts, a pinned tensor this example owns; the bank reads
    # it in place (cold experts) and loads the boot map's hot ones from it: no host store of its own
    weights = torch.empty((args.layers, args.experts, nbytes), dtype=torch.uint8).pin_memory()
    for li, layer in enumerate(model.model.layers):
        ex = layer.mlp.experts
        for e in range(args.experts):
            blob = torch.cat([ex.gate_up_proj[e].reshape(-1), ex.down_proj[e].reshape(-1)])
            weights[li, e].copy_(blob.view(torch.uint8))
    torch.cuda.synchronize()
    boot = experts.ResidencyMap.first_k("olmoe-random", g)
    bank = tt.ExpertBank(boot, host=weights)
    assert bank.layout["host_ptr"] == weights.data_ptr()  # served from the caller's tensor
    tt.warmup()
    counters = tt.DeviceCounters(g)
    srv = Serving(model, bank, counters)
    for li, layer in enumerate(model.model.layers):
        layer.mlp.experts._tierkit = srv
        layer.mlp.experts._tierkit_layer = li
    model.set_experts_implementation("tierkit")
    bank.reload(boot)
    srv.refresh()
    greedy(model, prompt, 8, srv.refresh)  # warm-up of the tierkit path before timing
    # all-HBM ceiling: the same expert loop (this file's forward) on the model's HBM weights
    srv.all_hbm = True
    hbm_ids, ref_tps = greedy(model, prompt, args.tokens)
    srv.all_hbm = False
    counters.drain()

    def run(name, m, controller=None):
        bank.reload(m)
        srv.picks = srv.cold = 0
        pc = experts.PickCounters(g)

        def between():
            counters.drain_into(pc)
            if controller is not None:
                bank.step(controller, pc)
            srv.refresh()

        srv.refresh()
        ids, tps = greedy(model, prompt, args.tokens, between)
        row = {"map": name, "tok_s": round(tps, 1), "vs_all_hbm": round(tps / ref_tps, 3),
               "cold_share": round(srv.cold / max(srv.picks, 1), 4),
               "token_identical": ids == ref}
        if controller is not None:
            row["swaps_applied"] = controller.stats["applied"]
        counters.drain()
        return row, pc

    rows = []
    row, profile = run("static-first-k", boot)
    rows.append(row)
    seed = experts.fit_seed_map("olmoe-random", g, profile.snapshot())
    rows.append(run("seed (fitted on the first run's counts)", seed)[0])
    # the crate's default policy (cost-aware, no flags), then the published ratio policy at fast
    # settings for a short run
    ctl = experts.Controller(boot)
    rows.append(run("first-k + controller (defaults)", boot, ctl)[0])
    ctl = experts.Controller(boot, {"policy": "ratio", "adaptive": None, "drain_every": 4, "half_life_steps": 16})
    rows.append(run("first-k + ratio policy (drain 4, half-life 16)", boot, ctl)[0])

    ok = all(r["token_identical"] for r in rows) and hbm_ids == ref
    print(json.dumps({
        "ok": ok, "model": "OlmoeForCausalLM (random weights)", "layers": args.layers,
        "experts": args.experts, "top_k": args.top_k, "hot_per_layer": args.hot,
        "expert_mib": round(nbytes / 2**20, 2), "tokens": args.tokens,
        "all_hbm_tok_s": round(ref_tps, 1), "transformers_eager_tok_s": round(eager_tps, 1),
        "runs": rows,
    }))
    bank.close()
    counters.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
