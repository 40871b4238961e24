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
        row_format: None,
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
        let ((i1, v1, a), (i2, v2, b)) = resolve_on_both(&mut cpu, &mut gp, &input, 8);
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
        row_format: None,
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

#[test]
fn gpu_deepseek_v4_rows_match_cpu_at_decode_width() {
    // DeepSeek-V4's paged split row (576 B value + 8 B scale, 64 rows in a 37,440-byte page;
    // SGLang 0.5.23 `kvcacheio.cuh`, FlashMLA's DeepSeek-V4 layout) at a decode width: k = 512,
    // a 1,024-row hot cache, 4 requests of 3,000 tokens, decode steps of 1 row and speculative
    // steps of 2; every resolve kernel with both copy back-ends (DMA: two descriptors per row).
    let Some(gpu) = tierkit_testkit::gpu_or_skip() else {
        return;
    };
    for engine in ResolveEngine::ALL {
        for backend in [CopyBackend::Gather, CopyBackend::Dma] {
            deepseek_v4_case(&gpu, engine, backend);
        }
    }
}

fn deepseek_v4_case(
    gpu: &std::sync::Arc<cuda_kernels::Gpu>,
    engine: ResolveEngine,
    backend: CopyBackend,
) {
    let g = Geometry {
        row_bytes: 584,
        layers: 2,
        page_rows: 64,
        arena_pages: 4 * 18 + 24,
        hot_rows: 1024,
        tail_rows: 64,
        scratch_rows: 4,
        layer_groups: Default::default(),
        row_format: Some(RowFormat::DEEPSEEK_V4),
    };
    assert_eq!(g.fixed_pages(), 18);
    assert_eq!(g.page_bytes(), 37_440);
    let gcfg = GpuPoolConfig {
        max_sessions: 4,
        max_history: 4096,
        backend,
    };
    let mut cpu = ElasticPool::new(g, PoolConfig::default()).unwrap();
    let mut gp = GpuElasticPool::new(gpu, g, PoolConfig::default(), gcfg).unwrap();
    gp.set_settle_readers(true);
    gp.set_resolve_engine(engine);
    let sessions = [31u64, 32, 33, 34];
    let mut history = BTreeMap::new();
    for &s in &sessions {
        let h = pattern_tokens(g.row_bytes, g.layers, s, 0, 3000);
        assert_eq!(cpu.admit(s, &h), gp.admit(s, &h));
        history.insert(s, h);
    }
    let (tb, rb) = (g.token_bytes(), g.row_bytes as usize);
    let mut rng = 17u64;
    let (mut served, mut misses) = (0u64, 0u64);
    for step in 0..12u32 {
        let k = 512;
        let rows_per = 1 + step as usize % 2;
        let qsl: Vec<i32> = (0..=sessions.len())
            .map(|i| (i * rows_per) as i32)
            .collect();
        let topk: Vec<i32> = (0..sessions.len() * rows_per * k)
            .map(|_| match below(&mut rng, 64) {
                0 => -1,
                _ => below(&mut rng, 3000) as i32,
            })
            .collect();
        let layer = step % 2;
        let input = ResolveInput {
            sessions: &sessions,
            query_start_loc: &qsl,
            seq_lens: &[3000; 4],
            topk: &topk,
            k,
            layer,
        };
        let n_rows = sessions.len() * rows_per;
        let ((i1, v1, a), (i2, v2, b)) = resolve_on_both(&mut cpu, &mut gp, &input, n_rows);
        assert_eq!((&i1, &v1), (&i2, &v2), "{engine:?} {backend:?} step {step}");
        assert_eq!(a.plan, b.plan);
        assert_eq!(a.stats, b.stats);
        misses += a.stats.misses;
        // Every served row holds the token's value ‖ scale at the resolved layer, on both sides.
        let plane = gp.device().download_plane(layer).unwrap();
        let cplane = cpu.plane(layer).unwrap();
        assert_eq!(plane.len(), 96 * 37_440);
        for (j, &r) in i2.iter().enumerate() {
            if r < 0 {
                continue;
            }
            let s = sessions[j / (rows_per * k)];
            let at = topk[j] as usize * tb + layer as usize * rb;
            let want = &history[&s][at..at + rb];
            let got = g.plane_row(&plane, r as u32).unwrap();
            assert_eq!(
                &got[..],
                want,
                "{engine:?} {backend:?} session {s} pick {j} row {r}"
            );
            assert_eq!(Some(got), g.plane_row(cplane, r as u32));
            served += 1;
        }
        drop(a);
        drop(b);
    }
    assert!(
        served > 10_000 && misses > 0,
        "{served} served, {misses} misses"
    );
}

/// One step resolved on the CPU reference and on the GPU pool: each side's indices, valid
/// counts (`rows` of them) and result, both resolves required to succeed.
#[allow(clippy::type_complexity)]
fn resolve_on_both(
    cpu: &mut ElasticPool,
    gp: &mut GpuElasticPool,
    input: &ResolveInput<'_>,
    rows: usize,
) -> (
    (Vec<i32>, Vec<i32>, kv_elastic::Resolved),
    (Vec<i32>, Vec<i32>, kv_elastic::Resolved),
) {
    let side = |r: &mut dyn Resolver| {
        let (mut i, mut v) = (vec![0; input.topk.len()], vec![0; rows]);
        let res = r
            .resolve(
                input,
                &mut ResolveOutput {
                    indices: &mut i,
                    valid_count: &mut v,
                },
            )
            .unwrap();
        (i, v, res)
    };
    (side(cpu), side(gp))
}
