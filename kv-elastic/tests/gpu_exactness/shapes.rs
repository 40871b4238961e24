//! `gpu_exactness`'s shape tests: a large geometry and block ids at decode widths, the GPU pool
//! against the CPU reference on every resolve engine (the harness is `gpu_exactness.rs`'s).

use super::*;

#[test]
fn gpu_pool_large_geometry_matches_cpu() {
    // Realistic row size and top-k: 656-byte rows, k = 256, hot cache 512, 4 requests x 2 rows;
    // each resolve kernel on its own pool pair.
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    for engine in ResolveEngine::ALL {
        large_geometry_case(&gpu, engine);
    }
}

fn large_geometry_case(gpu: &std::sync::Arc<cuda_kernels::Gpu>, engine: ResolveEngine) {
    let g = Geometry {
        row_bytes: 656,
        layers: 2,
        page_rows: 64,
        arena_pages: 40,
        hot_rows: 512,
        tail_rows: 64,
        scratch_rows: 4,
        layer_groups: Default::default(),
    };
    let sessions = [11u64, 12, 13, 14];
    let (mut cpu, mut gp) = four_sessions_admitted(gpu, g, engine, &sessions);
    let mut rng = 5u64;
    for step in 0..12 {
        let k = 256;
        let mut topk = Vec::new();
        for _ in 0..sessions.len() * 2 * k {
            topk.push(if below(&mut rng, 50) == 0 {
                -1
            } else {
                below(&mut rng, 3000) as i32
            });
        }
        let input = ResolveInput {
            sessions: &sessions,
            query_start_loc: &[0, 2, 4, 6, 8],
            seq_lens: &[3000; 4],
            topk: &topk,
            k,
            layer: step % 2,
        };
        let (mut i1, mut v1) = (vec![0; topk.len()], vec![0; 8]);
        let (mut i2, mut v2) = (vec![0; topk.len()], vec![0; 8]);
        let a = cpu.resolve(
            &input,
            &mut ResolveOutput {
                indices: &mut i1,
                valid_count: &mut v1,
            },
        );
        let b = gp.resolve(
            &input,
            &mut ResolveOutput {
                indices: &mut i2,
                valid_count: &mut v2,
            },
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!((i1, v1), (i2.clone(), v2));
        assert_eq!(a.plan, b.plan);
        assert_eq!(a.stats, b.stats);
        let plane = gp.device().download_plane(step % 2).unwrap();
        let cplane = cpu.plane(step % 2).unwrap();
        for &r in i2.iter().filter(|&&r| r >= 0) {
            let at = r as usize * 656;
            assert_eq!(plane[at..at + 656], cplane[at..at + 656]);
        }
    }
}

#[test]
fn gpu_block_ids_match_cpu_at_decode_widths() {
    // Block-id top-k at production widths (MiniMax-M3 style; SGLang's `TopKIsBlocks`): 656-byte
    // rows, a 2048-row hot cache, blocks of 64 (32 ids = 2048 positions: the lean512 engine's
    // widest entry), 16 and 5 (409 ids = 2045 positions: a block width that divides nothing);
    // decode steps, speculative steps of 2 rows with per-query bounds, and visible lengths that
    // end inside a block; every resolve kernel on its own pool pair.
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    for engine in ResolveEngine::ALL {
        for block in [64u32, 16, 5] {
            block_id_case(&gpu, engine, block);
        }
    }
}

fn block_id_case(gpu: &std::sync::Arc<cuda_kernels::Gpu>, engine: ResolveEngine, block: u32) {
    let g = Geometry {
        row_bytes: 656,
        layers: 2,
        page_rows: 64,
        arena_pages: 4 * 34 + 24,
        hot_rows: 2048,
        tail_rows: 64,
        scratch_rows: 4,
        layer_groups: Default::default(),
    };
    let sessions = [21u64, 22, 23, 24];
    let (mut cpu, mut gp) = four_sessions_admitted(gpu, g, engine, &sessions);
    let k = (2048 / block) as usize;
    let mut rng = 11u64 + block as u64;
    let (mut served, mut misses) = (0u64, 0u64);
    for step in 0..10u32 {
        // Even steps decode (one row per session), odd steps verify drafts (two rows each, the
        // first bounded one position short of the second).
        let rows_per = 1 + (step % 2) as usize;
        let seq_lens: Vec<i32> = sessions
            .iter()
            .map(|_| 2000 + below(&mut rng, 1001) as i32)
            .collect();
        let bounds: Vec<i32> = seq_lens
            .iter()
            .flat_map(|&l| (0..rows_per as i32).map(move |r| l - rows_per as i32 + 1 + r))
            .collect();
        let mut topk = Vec::new();
        for &bound in &bounds {
            // The blocks overlapping the bound, one wholly past it, and -1.
            let blocks = (bound as u64).div_ceil(block as u64) + 1;
            for _ in 0..k {
                topk.push(if below(&mut rng, 16) == 0 {
                    -1
                } else {
                    below(&mut rng, blocks) as i32
                });
            }
        }
        let qsl: Vec<i32> = (0..=sessions.len() as i32)
            .map(|r| r * rows_per as i32)
            .collect();
        let input = ResolveInput {
            sessions: &sessions,
            query_start_loc: &qsl,
            seq_lens: &seq_lens,
            topk: &topk,
            k,
            layer: step % 2,
        };
        let opts = ResolveOptions {
            layout: if step % 4 == 1 {
                OutputLayout::Packed
            } else {
                OutputLayout::InPlace
            },
            query_seq_lens: (rows_per > 1).then_some(&bounds[..]),
            block_positions: block,
        };
        let n = topk.len() * block as usize;
        let rows = bounds.len();
        let (mut i1, mut v1) = (vec![0; n], vec![0; rows]);
        let (mut i2, mut v2) = (vec![0; n], vec![0; rows]);
        let a = cpu.resolve_with(
            &input,
            &opts,
            &mut ResolveOutput {
                indices: &mut i1,
                valid_count: &mut v1,
            },
        );
        let b = gp.resolve_with(
            &input,
            &opts,
            &mut ResolveOutput {
                indices: &mut i2,
                valid_count: &mut v2,
            },
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(
            (&i1, &v1),
            (&i2, &v2),
            "block {block} step {step} {engine:?}"
        );
        assert_eq!(a.plan, b.plan);
        assert_eq!(a.stats, b.stats);
        // Every in-place column serves the position it stands for, in both arenas.
        let picks = tierkit_testkit::expand_block_ids(&topk, k, block, &bounds);
        let plane = gp.device().download_plane(step % 2).unwrap();
        let cplane = cpu.plane(step % 2).unwrap();
        let mut want = vec![0u8; 656];
        for (j, &r) in i2.iter().enumerate().filter(|&(_, &r)| r >= 0) {
            let at = r as usize * 656;
            assert_eq!(plane[at..at + 656], cplane[at..at + 656]);
            if opts.layout == OutputLayout::InPlace {
                let s = sessions[j / (k * block as usize) / rows_per];
                tierkit_testkit::pattern_row(s, picks[j] as u32, step % 2, &mut want);
                assert_eq!(
                    plane[at..at + 656],
                    want[..],
                    "column {j}: position {}",
                    picks[j]
                );
            }
        }
        served += a.stats.picks;
        misses += a.stats.misses;
    }
    assert!(
        served > 0 && misses > 0,
        "block {block}: nothing served or fetched"
    );
}
