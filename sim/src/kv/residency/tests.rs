//! Unit tests of `residency.rs` (beside the code, in their own file for length).

use super::*;
use kv_elastic::{Geometry, LayerGroups, PoolConfig};

/// Pages of 4 rows; fixed rows 8 hot + 4 tail = 3 pages.
fn pool(arena_pages: u32, elastic: bool) -> ElasticPool {
    let g = Geometry {
        row_bytes: 1,
        layers: 1,
        page_rows: 4,
        arena_pages,
        hot_rows: 8,
        tail_rows: 4,
        scratch_rows: 0,
        layer_groups: LayerGroups::per_layer(),
        row_format: None,
    };
    ElasticPool::new(g, PoolConfig { elastic }).unwrap()
}

fn admit(r: &mut Residency, p: &mut ElasticPool, id: u64, tokens: u32) -> AdmitOutcome {
    r.admit(p, id, &vec![0u8; tokens as usize], tokens).unwrap()
}

fn held(p: &ElasticPool, s: u64) -> Vec<u32> {
    let t = p.placement(s).unwrap().page_table;
    (0..t.len() as u32)
        .filter(|&j| t[j as usize] >= 0)
        .collect()
}

#[test]
fn sglang_demotes_the_largest_resident_first_waits_for_its_backup_and_never_promotes_back() {
    let mut p = pool(30, true);
    let mut r = Residency::new(ResidencyKind::SglangDemote, true);
    r.observe_step(3, 0, 1.0);
    // A: 40 tokens = 9 pages + 3 fixed; B: 24 = 5 + 3; C: 32 = 7 + 3 -> 30 pages, none free.
    for (id, n) in [(1, 40), (2, 24), (3, 32)] {
        assert!(matches!(
            admit(&mut r, &mut p, id, n),
            AdmitOutcome::Admitted { .. }
        ));
    }
    assert_eq!(p.pages().free, 0);
    assert_eq!(r.counters().demotions, 0, "no pressure, no demotion");
    // D needs 4 + 3 pages: the largest resident request (A, 40 tokens) is demoted whole.
    r.begin_round();
    assert_eq!(
        admit(&mut r, &mut p, 4, 20),
        AdmitOutcome::Admitted { borrowed: 4 }
    );
    assert!(held(&p, 1).is_empty() && r.in_hot_mode(1));
    assert_eq!((held(&p, 2).len(), held(&p, 3).len()), (5, 7));
    let c = *r.counters();
    assert_eq!((c.demotions, c.pages_taken), (1, 9));
    assert_eq!(
        c.mirror_tokens,
        40 + 24 + 32 + 20,
        "every prefix is backed up"
    );
    assert_eq!(
        c.backup_wait_tokens,
        3 + 1,
        "the batch's last step, then A's newest token"
    );
    p.check_invariants().unwrap();
    // B finishes: its pages come back, but A is never promoted back (no growth for it).
    p.finish(2).unwrap();
    r.finished(2);
    for _ in 0..3 {
        r.between_steps(&mut p, &[1, 3, 4], 64).unwrap();
    }
    assert!(held(&p, 1).is_empty());
    assert!(p.pages().free >= 8);
    // The same pressure under the elastic policy: pages are lent back when it falls.
    let mut q = pool(30, true);
    let mut e = Residency::new(ResidencyKind::Elastic, true);
    for (id, n) in [(1, 40), (2, 24), (3, 32), (4, 20)] {
        e.begin_round();
        assert!(matches!(
            admit(&mut e, &mut q, id, n),
            AdmitOutcome::Admitted { .. }
        ));
    }
    assert_eq!(e.counters().demotions, 0);
    assert!(
        held(&q, 1).len() < 9,
        "elastic took A's pages in proportion"
    );
    q.finish(2).unwrap();
    for _ in 0..3 {
        e.between_steps(&mut q, &[1, 3, 4], 64).unwrap();
    }
    assert_eq!(held(&q, 1).len(), 9, "promoted back once pressure fell");
}

#[test]
fn a_resident_sglang_request_that_outgrows_the_pool_demotes_the_largest() {
    let mut p = pool(20, true);
    let mut r = Residency::new(ResidencyKind::SglangDemote, true);
    // A: 36 tokens (8 pages + 3), B: 28 tokens (6 + 3): 20 pages.
    admit(&mut r, &mut p, 1, 36);
    admit(&mut r, &mut p, 2, 28);
    assert_eq!(p.pages().free, 0);
    // B decodes 4 tokens: a new page is due, none is free -> A (the largest) is demoted.
    p.append(2, &[0u8; 4]).unwrap();
    r.between_steps(&mut p, &[1, 2], 64).unwrap();
    assert!(r.in_hot_mode(1) && !r.in_hot_mode(2));
    assert_eq!(held(&p, 2).len(), 7);
    assert!(held(&p, 1).is_empty());
    p.check_invariants().unwrap();
}

#[test]
fn vllm_pins_pages_until_the_watermark_then_reuses_them_fifo_newest_first() {
    // 40 pages: watermark max(3, 4) = 4.
    let mut p = pool(40, true);
    let mut r = Residency::new(ResidencyKind::VllmHybrid, true);
    assert_eq!(vllm_watermark(&p), 4);
    // A: 40 tokens (9 + 3), B: 44 tokens (10 + 3) -> 25 pages, 15 free.
    assert_eq!(
        admit(&mut r, &mut p, 1, 40),
        AdmitOutcome::Admitted { borrowed: 9 }
    );
    admit(&mut r, &mut p, 2, 44);
    r.before_step(&mut p, &[1, 2]);
    assert_eq!(
        r.counters().transitions,
        0,
        "15 free pages: above the watermark"
    );
    // C: 36 tokens (8 + 3) -> 4 free: not below the watermark either.
    admit(&mut r, &mut p, 3, 36);
    r.before_step(&mut p, &[1, 2, 3]);
    assert_eq!(r.counters().transitions, 0);
    // E: 4 tokens, no history page, 3 fixed -> 1 free. At the next boundary A takes its hot
    // region (its 9 pages become evictable, newest first), which lifts the free count above
    // the watermark, so B and C stay pinned.
    admit(&mut r, &mut p, 5, 4);
    r.before_step(&mut p, &[1, 2, 3, 5]);
    assert!(r.in_hot_mode(1) && !r.in_hot_mode(2) && !r.in_hot_mode(3));
    assert_eq!(r.counters().transitions, 1);
    // D (16 tokens: 3 + 3) lands resident by reusing the free queue's head: A's newest
    // pages go first (5 of them: 1 page was free).
    assert_eq!(
        admit(&mut r, &mut p, 4, 16),
        AdmitOutcome::Admitted { borrowed: 3 }
    );
    assert_eq!(held(&p, 1), [0, 1, 2, 3], "A kept its oldest pages");
    assert_eq!((held(&p, 2).len(), held(&p, 3).len()), (10, 8));
    assert_eq!(r.counters().pages_taken, 5);
    // F's history (14 pages) cannot fit even with A's 4 evictable pages: it lands in host
    // memory on its hot region alone (3 more of A's pages reused), already in hot mode.
    assert_eq!(
        admit(&mut r, &mut p, 6, 60),
        AdmitOutcome::Admitted { borrowed: 0 }
    );
    assert!(r.in_hot_mode(6));
    assert_eq!(held(&p, 1), [0]);
    assert_eq!(r.counters().landed_on_host, 1);
    assert_eq!(r.counters().mirror_tokens, 40 + 44 + 36 + 4 + 16 + 60);
    p.check_invariants().unwrap();
    // New pages are lent as requests decode; pages lost to reuse never come back.
    p.finish(2).unwrap();
    r.finished(2);
    p.append(1, &[0u8; 4]).unwrap(); // A: 44 tokens, page 9 is new
    for _ in 0..3 {
        r.between_steps(&mut p, &[1, 3, 4, 5, 6], 64).unwrap();
    }
    assert_eq!(held(&p, 1), [0, 9], "only the new page was lent");
    assert!(p.pages().free >= 10);
    p.check_invariants().unwrap();
}

#[test]
fn the_link_share_gate_admits_under_pressure_only_while_misses_take_less_than_the_base() {
    let mut g = AdmissionGate::default();
    assert_eq!(g.link_share_tokens(), None);
    g.begin_round();
    assert!(
        g.allow_under_pressure() && g.allow_under_pressure(),
        "inert before a fit"
    );
    // Steps of 1000 µs + 10 µs × batch + 2 µs × miss: the link's share is 500 missed tokens.
    for (b, m) in [(10, 0), (20, 100), (30, 50), (40, 300), (50, 400)] {
        g.observe(b, m, 1000.0 + 10.0 * b as f64 + 2.0 * m as f64);
    }
    let l = g.link_share_tokens().unwrap();
    assert!((l - 500.0).abs() < 1e-6, "{l}");
    g.begin_round();
    assert!(g.allow_under_pressure(), "400 misses < 500");
    assert!(
        !g.allow_under_pressure(),
        "one admission under pressure per step"
    );
    g.observe(50, 600, 1000.0 + 500.0 + 1200.0);
    g.begin_round();
    assert!(!g.allow_under_pressure(), "600 misses >= 500");
    // Step times that do not grow with misses: no price, no gate.
    let mut free = AdmissionGate::default();
    for (b, m) in [(10, 0), (20, 100), (30, 50), (40, 300)] {
        free.observe(b, m, 1000.0 + 10.0 * b as f64);
    }
    assert_eq!(free.link_share_tokens(), None);
    // Through the policy: a gated admission under pressure is counted and waits.
    let mut p = pool(12, true);
    let mut r = Residency::new(ResidencyKind::Elastic, true);
    admit(&mut r, &mut p, 1, 40); // 3 fixed + 9 pages: none free
    for (b, m) in [(10, 0), (20, 100), (30, 50), (40, 300), (1, 600)] {
        r.observe_step(b, m, 1000.0 + 10.0 * b as f64 + 2.0 * m as f64);
    }
    r.begin_round();
    assert_eq!(admit(&mut r, &mut p, 2, 8), AdmitOutcome::NoRoom);
    assert_eq!(r.counters().gated, 1);
    // Ungated, the same admission takes its pages from session 1.
    let mut u = Residency::new(ResidencyKind::Elastic, false);
    assert!(matches!(
        admit(&mut u, &mut p, 2, 8),
        AdmitOutcome::Admitted { .. }
    ));
}
