//! Reference integration of `kv-elastic` in a CPU engine loop: size the pool from an HBM budget,
//! admit sessions with their history, and each decode step, layer by layer, resolve that layer's
//! indexer top-k picks (a per-layer indexer, as DeepSeek-V3.2's: the geometry's default layer
//! groups give each layer its own hot cache; misses are fetched from host into it), "attend" over
//! the resolved rows, then append each session's new token, finish sessions, and between steps
//! hand pages back and lend free HBM to sessions missing history. Every resolved row is checked
//! against the host copy: the tier is exact. (Layers that share one indexer's picks are declared
//! one group, `g.layer_groups = LayerGroups::one()`: one resolve then fills all of them.)
//!
//! Run: `cargo run --release -p tierkit-examples --example kv_engine_loop`
use kv_elastic::{ElasticPool, Geometry, PoolConfig, PoolSizing};
use kv_elastic::{ResolveInput, ResolveOutput, Resolver};

const ROW: usize = 64; // bytes per token row per layer (656 for DeepSeek fp8 MLA)
const LAYERS: usize = 2;
const K: usize = 16; // indexer top-k

/// Token `t` of session `s`: every layer's row filled with a byte derived from `(s, t, layer)`.
fn token(s: u64, t: u64) -> Vec<u8> {
    (0..LAYERS * ROW)
        .map(|i| (s * 31 + t * 7 + (i / ROW) as u64) as u8)
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let g = Geometry::for_hbm_budget(&PoolSizing {
        budget_bytes: 128 << 10, // of HBM for the arena
        row_bytes: ROW as u32,
        layers: LAYERS as u32,
        page_rows: 16,
        hot_rows: 32, // per session
        tail_rows: 16,
        scratch_rows: 0, // no speculative decoding here
    })?;
    let mut pool = ElasticPool::new(g, PoolConfig { elastic: true })?;
    println!("arena: {} pages of {} rows", g.arena_pages, g.page_rows);
    let mut len = std::collections::BTreeMap::new(); // session -> committed tokens
    for s in 1..=4u64 {
        let history: Vec<u8> = (0..400 + 100 * s).flat_map(|t| token(s, t)).collect();
        pool.admit(s, &history)?; // history copied to host; newest pages borrowed into HBM
        len.insert(s, 400 + 100 * s);
    }
    let (mut picks, mut misses) = (0u64, 0u64);
    for step in 0..64u64 {
        let sessions: Vec<u64> = len.keys().copied().collect();
        let seq_lens: Vec<i32> = sessions.iter().map(|s| len[s] as i32).collect();
        // One query row per session.
        let qsl: Vec<i32> = (0..=sessions.len() as i32).collect();
        for layer in 0..LAYERS {
            // This layer's indexer top-k: recent tokens and a spread over the history (each layer
            // its own), -1 padding last.
            let pick = |n: i32, j: i32| {
                if j + 1 == K as i32 {
                    -1
                } else {
                    (n - 1 - (3 + layer as i32) * j * j).max(0)
                }
            };
            let topk: Vec<i32> = seq_lens
                .iter()
                .flat_map(|&n| (0..K as i32).map(move |j| pick(n, j)))
                .collect();
            let (mut indices, mut valid) = (vec![0i32; topk.len()], vec![0i32; sessions.len()]);
            let input = ResolveInput {
                sessions: &sessions,
                query_start_loc: &qsl,
                seq_lens: &seq_lens,
                topk: &topk,
                k: K,
                layer: layer as u32,
            };
            let mut out = ResolveOutput {
                indices: &mut indices,
                valid_count: &mut valid,
            };
            let done = pool.resolve(&input, &mut out)?;
            // "Attention" at this layer: every resolved row holds the bytes a fully resident
            // cache would.
            for (i, (&pos, &row)) in topk
                .iter()
                .zip(&indices)
                .enumerate()
                .filter(|(_, (&p, _))| p >= 0)
            {
                let want = token(sessions[i / K], pos as u64);
                assert_eq!(
                    pool.arena_row(layer as u32, row).as_deref(),
                    Some(&want[layer * ROW..][..ROW])
                );
            }
            (picks, misses) = (picks + done.stats.picks, misses + done.stats.misses);
            done.ticket.complete(); // the kernels that read these rows have finished
        }
        for &s in &sessions {
            let n = len[&s];
            pool.append(s, &token(s, n))?; // the step's new KV row, committed to host
            *len.get_mut(&s).expect("live") += 1;
        }
        if step == 31 {
            pool.finish(1)?; // its pages go back in bounded chunks below
            len.remove(&1);
        }
        let m = pool.between_steps(8)?; // at most 8 pages handed back and 8 lent per step
        if m.handed_back + m.grown > 0 {
            println!(
                "step {step}: handed back {} pages, lent {} to sessions missing history",
                m.handed_back, m.grown
            );
        }
    }
    // This selection reaches far back into 500-800-token histories with a 32-row hot cache, so
    // many picks miss; the indexer of a real model repeats itself far more from step to step.
    println!(
        "{picks} picks resolved exactly, {misses} rows fetched from host ({:.1}%)",
        100.0 * misses as f64 / picks as f64
    );
    pool.check_invariants()?; // pages, loans and tables agree
    Ok(())
}
