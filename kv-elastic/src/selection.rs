//! A top-k selection generator calibrated to published hot-cache miss rates.
//!
//! No public trace of sparse-attention top-k selections exists, so the simulation draws them from a
//! model calibrated to the HiSparse paper's figures (GLM-5.1, top-k = 2048): a per-request hot cache
//! of k / 2k / 4k rows misses about 30% / 13.4% / 6.7% of picks, and consecutive decode steps'
//! top-k sets overlap strongly.
//!
//! Model: each step keeps `1 − churn` of the previous step's set and replaces the rest with new picks.
//! A new pick is, with probability `uniform_mix`, uniform over the history; otherwise its
//! popularity rank follows a Zipf law of exponent `zipf_s`, and the rank maps to a position through a
//! fixed per-request bijection (multiplicative hash modulo a prime), so popular positions are spread
//! over the whole history and stay popular as the history grows. `churn` sets the miss rate of a
//! k-row cache (it holds exactly the previous set); `zipf_s` and `uniform_mix` set how quickly misses
//! fall with a larger cache. [`SelectionParams::calibrated`] holds the fitted values and
//! [`measure_hot_cache_miss_rate`] measures them with the pool's own [`HotCache`].

use hashbrown::HashSet;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::hot::HotCache;

/// Parameters of the selection model.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SelectionParams {
    /// Picks per query (top-k).
    pub top_k: u32,
    /// Fraction of the set replaced each step (0..=1).
    pub churn: f64,
    /// Zipf exponent of new picks' popularity ranks (> 0, ≠ 1).
    pub zipf_s: f64,
    /// Probability that a new pick is uniform over the history instead of Zipf.
    pub uniform_mix: f64,
}

impl SelectionParams {
    /// The calibrated model for `top_k` (fitted at top-k = 2048, history 32,768; see the module doc
    /// and `docs/kv.md` for the measured miss rates).
    pub fn calibrated(top_k: u32) -> Self {
        Self {
            top_k,
            churn: 0.30,
            zipf_s: 0.75,
            uniform_mix: 0.0,
        }
    }
}

/// Draws one request's top-k positions step by step (see the module doc).
#[derive(Debug, Clone)]
pub struct SelectionGen {
    params: SelectionParams,
    rng: ChaCha8Rng,
    prime: u64,
    mul: u64,
    add: u64,
    zipf_top: f64,
    current: Vec<u32>,
    in_set: HashSet<u32>,
}

fn next_prime(n: u64) -> u64 {
    let mut p = n.max(2);
    loop {
        if (2..).take_while(|d| d * d <= p).all(|d| !p.is_multiple_of(d)) {
            return p;
        }
        p += 1;
    }
}

impl SelectionGen {
    /// A generator for a request whose history will never exceed `max_history` positions.
    pub fn new(params: SelectionParams, seed: u64, max_history: u32) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let prime = next_prime(max_history as u64 + 1);
        let mul = rng.random_range(1..prime);
        let add = rng.random_range(0..prime);
        let zipf_top = ((prime + 1) as f64).powf(1.0 - params.zipf_s) - 1.0;
        Self {
            params,
            rng,
            prime,
            mul,
            add,
            zipf_top,
            current: Vec::new(),
            in_set: HashSet::new(),
        }
    }

    /// The parameters.
    pub fn params(&self) -> &SelectionParams {
        &self.params
    }

    fn draw(&mut self, history: u32) -> u32 {
        if self.rng.random::<f64>() < self.params.uniform_mix {
            return self.rng.random_range(0..history);
        }
        loop {
            let u: f64 = self.rng.random();
            let x = (1.0 + u * self.zipf_top).powf(1.0 / (1.0 - self.params.zipf_s));
            let rank = (x.floor() as u64).saturating_sub(1).min(self.prime - 1);
            let pos = (self.mul as u128 * rank as u128 + self.add as u128) % self.prime as u128;
            if (pos as u64) < history as u64 {
                return pos as u32;
            }
        }
    }

    /// Draws the next step's picks for a history of `history` positions into `out` (cleared first;
    /// `top_k` entries, distinct positions `< history`, `-1` padding when `history < top_k`).
    pub fn step(&mut self, history: u32, out: &mut Vec<i32>) {
        out.clear();
        let k = self.params.top_k as usize;
        if history as usize <= k {
            self.current.clear();
            self.in_set.clear();
            out.extend((0..history as i32).chain(std::iter::repeat_n(-1, k - history as usize)));
            return;
        }
        if self.current.is_empty() {
            self.in_set.clear();
        } else {
            let replace = ((self.params.churn * k as f64).round() as usize).min(self.current.len());
            for _ in 0..replace {
                let i = self.rng.random_range(0..self.current.len());
                let p = self.current.swap_remove(i);
                self.in_set.remove(&p);
            }
        }
        while self.current.len() < k {
            let mut p = self.draw(history);
            let mut tries = 0;
            while self.in_set.contains(&p) {
                tries += 1;
                p = if tries < 64 {
                    self.draw(history)
                } else {
                    (p + 1) % history
                };
            }
            self.in_set.insert(p);
            self.current.push(p);
        }
        out.extend(self.current.iter().map(|&p| p as i32));
    }
}

/// Runs one generator for `steps` steps over a fixed history against a bare [`HotCache`] of each
/// size in `hot_rows` (no tail, no borrowed pages) and returns the miss rate per size (misses / picks,
/// after `warmup` steps). This is how the calibration is checked.
pub fn measure_hot_cache_miss_rate(
    params: SelectionParams,
    history: u32,
    hot_rows: &[u32],
    steps: u32,
    warmup: u32,
    seed: u64,
) -> Vec<f64> {
    hot_rows
        .iter()
        .map(|&rows| {
            let mut gen = SelectionGen::new(params, seed, history);
            let mut cache = HotCache::new(rows, history);
            let mut picks = Vec::new();
            let (mut misses, mut total) = (0u64, 0u64);
            for step in 0..steps {
                gen.step(history, &mut picks);
                let call = step as u64 + 1;
                let mut miss_list = Vec::new();
                for &p in picks.iter().filter(|&&p| p >= 0) {
                    match cache.lookup(p as u32) {
                        Some(s) => cache.touch(s, call),
                        None => miss_list.push(p as u32),
                    }
                }
                for &p in &miss_list {
                    let v = cache.victim(call).expect("k <= hot_rows");
                    cache.install(v, p, call);
                }
                if step >= warmup {
                    misses += miss_list.len() as u64;
                    total += picks.iter().filter(|&&p| p >= 0).count() as u64;
                }
            }
            misses as f64 / total.max(1) as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_are_distinct_and_in_range() {
        let mut g = SelectionGen::new(SelectionParams::calibrated(64), 7, 1000);
        let mut out = Vec::new();
        for h in [10u32, 64, 65, 500, 1000] {
            g.step(h, &mut out);
            assert_eq!(out.len(), 64);
            let valid: Vec<i32> = out.iter().copied().filter(|&p| p >= 0).collect();
            assert!(valid.iter().all(|&p| (p as u32) < h));
            let set: HashSet<i32> = valid.iter().copied().collect();
            assert_eq!(set.len(), valid.len());
            assert_eq!(valid.len(), 64.min(h as usize));
        }
    }

    #[test]
    fn consecutive_steps_overlap_by_one_minus_churn() {
        let mut g = SelectionGen::new(SelectionParams::calibrated(256), 1, 10_000);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        g.step(10_000, &mut a);
        g.step(10_000, &mut b);
        let sa: HashSet<i32> = a.into_iter().collect();
        let overlap = b.iter().filter(|p| sa.contains(*p)).count() as f64 / 256.0;
        assert!(overlap >= 0.69, "overlap {overlap}");
    }
}
