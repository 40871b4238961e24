//! Unit tests of `layout` (geometry checks, sizing, row offsets).

use super::*;

fn g() -> Geometry {
    Geometry {
        row_bytes: 16,
        layers: 2,
        page_rows: 4,
        arena_pages: 8,
        hot_rows: 6,
        tail_rows: 4,
        scratch_rows: 2,
        layer_groups: Default::default(),
        row_format: None,
    }
}

#[test]
fn fixed_pages_round_up() {
    assert_eq!(g().fixed_rows(), 12);
    assert_eq!(g().fixed_pages(), 3);
    assert_eq!(g().arena_rows(), 32);
    assert_eq!(g().token_bytes(), 32);
    g().validate().unwrap();
    // Fixed local rows 0..12 over fixed pages [5, 1, 7] of 4 rows; a borrowed page's rows.
    let fixed = [5, 1, 7];
    let rows: Vec<u32> = (0..12).map(|l| g().fixed_row(&fixed, l)).collect();
    assert_eq!(rows, [20, 21, 22, 23, 4, 5, 6, 7, 28, 29, 30, 31]);
    assert_eq!((g().page_row(3, 0), g().page_row(3, 13)), (12, 13));
}

#[test]
fn arena_too_small_is_typed() {
    let small = Geometry {
        arena_pages: 2,
        ..g()
    };
    assert_eq!(
        small.validate(),
        Err(KvError::ArenaTooSmall {
            arena_pages: 2,
            needed_pages: 3
        })
    );
    assert!(matches!(
        Geometry {
            row_bytes: 0,
            ..g()
        }
        .validate(),
        Err(KvError::InvalidGeometry(_))
    ));
}

#[test]
fn huge_fields_are_typed_errors_not_panics() {
    let bad = |g: Geometry| matches!(g.validate(), Err(KvError::InvalidGeometry(_)));
    // hot + tail + scratch would wrap to 0 fixed rows (the breaker's `--tail-rows 4294967232`).
    assert!(bad(Geometry {
        hot_rows: 64,
        tail_rows: 4_294_967_232,
        ..g()
    }));
    assert!(bad(Geometry {
        scratch_rows: u32::MAX,
        ..g()
    }));
    assert_eq!(
        Geometry {
            scratch_rows: u32::MAX,
            ..g()
        }
        .fixed_rows(),
        u32::MAX
    );
    // A 2 TB plane, u32::MAX layers, 4 GiB tokens.
    assert!(bad(Geometry {
        row_bytes: 1000,
        page_rows: 1 << 20,
        arena_pages: 2000,
        ..g()
    }));
    assert!(bad(Geometry {
        layers: u32::MAX,
        ..g()
    }));
    assert!(bad(Geometry {
        row_bytes: u32::MAX,
        layers: 1,
        ..g()
    }));
    assert!(bad(Geometry {
        page_rows: 0,
        ..g()
    }));
    assert_eq!(
        Geometry {
            page_rows: 0,
            ..g()
        }
        .fixed_pages(),
        u32::MAX
    );
    // A 2^31-row hot cache (28 GB of CLOCK state per session) in a valid 2 GiB arena.
    assert!(bad(Geometry {
        row_bytes: 1,
        layers: 1,
        page_rows: 1 << 16,
        arena_pages: 32_767,
        hot_rows: (1 << 31) - (1 << 17),
        tail_rows: 1,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: None,
    }));
    // At the bounds: still valid.
    Geometry {
        row_bytes: 656,
        layers: 61,
        page_rows: 64,
        arena_pages: 10_000,
        hot_rows: 4096,
        tail_rows: 64,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: None,
    }
    .validate()
    .unwrap();
}

fn sizing(
    budget_bytes: u64,
    row_bytes: u32,
    layers: u32,
    page_rows: u32,
    hot_rows: u32,
    tail_rows: u32,
    scratch_rows: u32,
) -> PoolSizing {
    PoolSizing {
        budget_bytes,
        row_bytes,
        layers,
        page_rows,
        hot_rows,
        tail_rows,
        scratch_rows,
    }
}

#[test]
fn for_hbm_budget_fills_the_budget_and_types_the_errors() {
    // 16-byte rows, 2 layers, 4-row pages: 128 bytes a page; fixed rows 6 + 4 + 2 = 3 pages.
    let g = Geometry::for_hbm_budget(&sizing(1000, 16, 2, 4, 6, 4, 2)).unwrap();
    assert_eq!(g.arena_pages, 7);
    assert_eq!(g.fixed_pages(), 3);
    g.validate().unwrap();
    assert_eq!(
        Geometry::for_hbm_budget(&sizing(383, 16, 2, 4, 6, 4, 2)),
        Err(KvError::BudgetTooSmall {
            budget_bytes: 383,
            needed_bytes: 384
        })
    );
    assert_eq!(
        Geometry::for_hbm_budget(&sizing(384, 16, 2, 4, 6, 4, 2)).map(|g| g.arena_pages),
        Ok(3)
    );
    assert!(matches!(
        Geometry::for_hbm_budget(&sizing(1 << 30, 0, 2, 4, 6, 4, 2)),
        Err(KvError::InvalidGeometry(_))
    ));
    assert!(matches!(
        Geometry::for_hbm_budget(&sizing(1 << 30, 16, 2, 4, 6, 0, 2)),
        Err(KvError::InvalidGeometry(_))
    ));
    // A huge budget is capped at the largest valid arena (int32 row indices).
    let big = Geometry::for_hbm_budget(&sizing(u64::MAX, 1, 1, 1, 1, 1, 0)).unwrap();
    assert_eq!(big.arena_rows(), i32::MAX as u64);
    big.validate().unwrap();
}

fn v4() -> Geometry {
    Geometry {
        row_bytes: 584,
        layers: 2,
        page_rows: 64,
        arena_pages: 4,
        hot_rows: 64,
        tail_rows: 64,
        scratch_rows: 0,
        layer_groups: Default::default(),
        row_format: Some(RowFormat::DEEPSEEK_V4),
    }
}

#[test]
fn deepseek_v4_rows_lie_where_sglang_puts_them() {
    let g = v4();
    g.validate().unwrap();
    assert_eq!(RowFormat::DEEPSEEK_V4.row_bytes(), 584);
    // kPageBytes = ceil(64 × 584 / 576) × 576 = 37,440 (64 B of padding).
    assert_eq!(g.page_bytes(), (64u64 * 584).div_ceil(576) * 576);
    assert_eq!(g.plane_bytes(), 4 * 37_440);
    assert_eq!(g.token_bytes(), 2 * 584);
    for row in [0u32, 1, 63, 64, 65, 200, 255] {
        let (page, slot) = (row as u64 / 64, row as u64 % 64);
        assert_eq!(
            g.row_offsets(row),
            (
                page * 37_440 + slot * 576,
                page * 37_440 + 64 * 576 + slot * 8
            ),
            "row {row}"
        );
    }
    // A row read back from a plane is value ‖ scale.
    let mut plane = vec![0u8; g.plane_bytes()];
    let (v, s) = g.row_offsets(70);
    plane[v as usize..v as usize + 576].fill(1);
    plane[s as usize..s as usize + 8].fill(2);
    let row = g.plane_row(&plane, 70).unwrap();
    assert_eq!((&row[..576], &row[576..]), (&[1u8; 576][..], &[2u8; 8][..]));
    assert_eq!(g.plane_row(&plane, 256), None);
    // An unvalidated geometry without pages reads nothing and divides by nothing.
    let no_pages = Geometry { page_rows: 0, ..g };
    assert_eq!(no_pages.plane_row(&plane, 70), None);
    assert_eq!(no_pages.row_offsets(3).0, 3 * no_pages.page_bytes());
    // Contiguous: one segment at row × row_bytes, as before the format existed.
    for fmt in [None, Some(RowFormat::Contiguous { bytes: 16 })] {
        let c = Geometry {
            row_format: fmt,
            ..self::g()
        };
        c.validate().unwrap();
        assert_eq!(c.plane_bytes(), 32 * 16);
        assert_eq!(c.row_offsets(13).0, 13 * 16);
        assert_eq!(c.format(), RowFormat::Contiguous { bytes: 16 });
    }
}

#[test]
fn bad_row_formats_are_typed_errors() {
    let bad = |f: RowFormat| {
        matches!(
            Geometry {
                row_format: Some(f),
                ..v4()
            }
            .validate(),
            Err(KvError::InvalidGeometry(_))
        )
    };
    assert!(bad(RowFormat::Contiguous { bytes: 583 }));
    let ok = |value, scale, page_rows, page_bytes| RowFormat::PagedSplit {
        value,
        scale,
        page_rows,
        page_bytes,
    };
    assert!(bad(ok(0, 584, 64, 37_440)));
    assert!(bad(ok(576, 16, 64, 37_440))); // value + scale != row_bytes
    assert!(bad(ok(u32::MAX, 8, 64, 37_440))); // value + scale overflows
    assert!(bad(ok(576, 8, 32, 37_440))); // not the geometry's page_rows
    assert!(bad(ok(576, 8, 64, 64 * 584 - 1))); // the rows do not fit the page
    assert!(!bad(ok(576, 8, 64, 64 * 584)));
    // A padded page counts against MAX_ARENA_BYTES.
    assert!(!bad(ok(576, 8, 64, u32::MAX)));
    assert!(matches!(
        Geometry {
            arena_pages: 1 << 20,
            layers: 64,
            row_format: Some(ok(576, 8, 64, u32::MAX)),
            ..v4()
        }
        .validate(),
        Err(KvError::InvalidGeometry(_))
    ));
}

#[test]
fn a_geometry_without_the_format_reads_as_contiguous() {
    let mut json = serde_json::to_value(g()).unwrap();
    assert!(json.get("row_format").is_none(), "{json}");
    json.as_object_mut().unwrap().remove("row_format");
    let back: Geometry = serde_json::from_value(json).unwrap();
    assert_eq!(back, g());
    let v = serde_json::to_string(&v4()).unwrap();
    assert_eq!(serde_json::from_str::<Geometry>(&v).unwrap(), v4());
}

#[test]
fn for_hbm_budget_counts_padded_pages_and_caps_them() {
    let sizing = |budget_bytes| PoolSizing {
        budget_bytes,
        row_bytes: 584,
        layers: 2,
        page_rows: 64,
        hot_rows: 128,
        tail_rows: 64,
        scratch_rows: 0,
    };
    let v4 = Some(RowFormat::DEEPSEEK_V4);
    // A budget fills with padded pages: never an arena over the budget.
    let g = Geometry::for_hbm_budget_with_format(&sizing(1 << 26), v4).unwrap();
    assert_eq!(g.row_format, v4);
    assert_eq!(g.arena_pages as u64, (1 << 26) / (2 * 37_440));
    assert!(g.arena_pages as u64 * g.page_bytes() * 2 <= 1 << 26);
    assert_eq!(
        Geometry::for_hbm_budget_with_format(&sizing(3 * 2 * 37_440 - 1), v4),
        Err(KvError::BudgetTooSmall {
            budget_bytes: 3 * 2 * 37_440 - 1,
            needed_bytes: 3 * 2 * 37_440
        })
    );
    // A budget past MAX_ARENA_BYTES caps the padded arena as it caps a contiguous one.
    for budget in [1 << 40, (1 << 40) + 1, 1 << 41, u64::MAX] {
        let g = Geometry::for_hbm_budget_with_format(&sizing(budget), v4).unwrap();
        assert_eq!(
            g.arena_pages as u64,
            MAX_ARENA_BYTES / (2 * 37_440),
            "{budget}"
        );
        g.validate().unwrap();
    }
    // A huge padded page: a small budget is too small (not an invalid geometry), a huge one
    // caps at the pages 1 TiB holds.
    let huge = Some(RowFormat::PagedSplit {
        value: 576,
        scale: 8,
        page_rows: 64,
        page_bytes: u32::MAX,
    });
    assert!(matches!(
        Geometry::for_hbm_budget_with_format(&sizing(1 << 20), huge),
        Err(KvError::BudgetTooSmall { .. })
    ));
    let g = Geometry::for_hbm_budget_with_format(&sizing(1 << 45), huge).unwrap();
    assert_eq!(
        g.arena_pages as u64,
        MAX_ARENA_BYTES / (2 * u32::MAX as u64)
    );
    // A format that does not fit the rows is refused; None is for_hbm_budget.
    let bad = Some(RowFormat::PagedSplit {
        value: 576,
        scale: 8,
        page_rows: 32,
        page_bytes: 37_440,
    });
    assert!(matches!(
        Geometry::for_hbm_budget_with_format(&sizing(1 << 26), bad),
        Err(KvError::InvalidGeometry(_))
    ));
    assert_eq!(
        Geometry::for_hbm_budget_with_format(&sizing(1 << 26), None),
        Geometry::for_hbm_budget(&sizing(1 << 26))
    );
}

#[test]
fn serde_reads_weird_formats_as_errors_or_validate_refuses_them() {
    let with = |fmt: &str| {
        let mut json = serde_json::to_value(v4()).unwrap();
        json["row_format"] = serde_json::from_str(fmt).unwrap();
        serde_json::from_value::<Geometry>(json)
    };
    // Not a format: serde errors, never a panic.
    for fmt in [
        r#"{"PagedSplit": {"value": -1, "scale": 8, "page_rows": 64, "page_bytes": 37440}}"#,
        r#"{"PagedSplit": {"value": 4294967296, "scale": 8, "page_rows": 64, "page_bytes": 1}}"#,
        r#"{"PagedSplit": {"value": 576.5, "scale": 8, "page_rows": 64, "page_bytes": 37440}}"#,
        r#"{"PagedSplit": {"value": 576, "scale": 8, "page_rows": 64}}"#,
        r#"{"PagedSplit": {"value": "576", "scale": 8, "page_rows": 64, "page_bytes": 37440}}"#,
        r#"{"Contiguous": {}}"#,
        r#"{"Paged": {"bytes": 584}}"#,
        r#""DeepSeekV4""#,
        r#"[576, 8, 64, 37440]"#,
        r#"7"#,
    ] {
        assert!(with(fmt).is_err(), "{fmt}");
    }
    // Formats that parse but do not fit the geometry: validate refuses them.
    for fmt in [
        r#"{"Contiguous": {"bytes": 0}}"#,
        r#"{"PagedSplit": {"value": 0, "scale": 584, "page_rows": 64, "page_bytes": 37440}}"#,
        r#"{"PagedSplit": {"value": 4294967295, "scale": 585, "page_rows": 64, "page_bytes": 37440}}"#,
        r#"{"PagedSplit": {"value": 576, "scale": 8, "page_rows": 0, "page_bytes": 37440}}"#,
        r#"{"PagedSplit": {"value": 576, "scale": 8, "page_rows": 64, "page_bytes": 0}}"#,
    ] {
        let g = with(fmt).unwrap();
        assert!(
            matches!(g.validate(), Err(KvError::InvalidGeometry(_))),
            "{fmt}"
        );
        // Never a division by zero or an out-of-range slice on the unvalidated geometry.
        let _ = (
            g.page_bytes(),
            g.row_offsets(u32::MAX),
            g.plane_row(&[0; 64], 3),
        );
    }
    // null is the default (contiguous); an explicit Contiguous of row_bytes is valid.
    assert_eq!(with("null").unwrap().row_format, None);
    with(r#"{"Contiguous": {"bytes": 584}}"#)
        .unwrap()
        .validate()
        .unwrap();
}
