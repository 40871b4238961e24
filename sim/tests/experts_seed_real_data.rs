//! Seed maps on real OLMoE routing counts (`../shared/data/moe/olmoe/routing-counts.json`,
//! layers 0, 7, 15): a map fitted on one domain can serve another worse than a uniform map.
//! Skips with a printed message when the shared data is absent.

use std::path::PathBuf;

use expert_residency::{
    fit_seed_map, merge_dumps, seed_coverage, CounterDump, Geometry, ResidencyMap,
};
use tierkit_sim::experts::trace::olmoe::routing_counts;

fn dump(json: &serde_json::Value, domain: &str) -> CounterDump {
    let layers = routing_counts(json, "olmoe", domain, 64).unwrap();
    let counts = layers
        .iter()
        .flat_map(|(_, c)| c.iter().map(|&x| x as f64))
        .collect();
    CounterDump::new(domain, layers.len() as u32, 64, counts).unwrap()
}

#[test]
fn held_out_coverage_on_real_counts() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data/moe/olmoe/routing-counts.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        println!(
            "SKIP held_out_coverage_on_real_counts: {} is absent",
            path.display()
        );
        return;
    };
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let (book, github) = (dump(&json, "book"), dump(&json, "github"));
    let g = Geometry::new(book.layers, 64, 16, 1).unwrap();
    let book_map = fit_seed_map("olmoe", &g, &book).unwrap();
    let github_map = fit_seed_map("olmoe", &g, &github).unwrap();
    let both = merge_dumps(&[(&book, 0.5), (&github, 0.5)]).unwrap();
    let both_map = fit_seed_map("olmoe", &g, &both).unwrap();
    let cover = |m: &ResidencyMap, d: &CounterDump| seed_coverage(m, d).unwrap().overall;
    let held_out = cover(&book_map, &github);
    let in_domain = cover(&github_map, &github);
    let merged = cover(&both_map, &github);
    println!(
        "github coverage: book-fitted {held_out:.3}, github-fitted {in_domain:.3}, \
         merged {merged:.3}, uniform expectation 0.250"
    );
    // The shared README measured 11% for the book-fitted map on github vs 25% uniform.
    assert!(held_out < 0.25, "held-out map worse than uniform");
    assert!(in_domain > 0.34);
    assert!(held_out < merged && merged < in_domain);
    // The fitted map round-trips through its saved form.
    let back = ResidencyMap::from_json(&book_map.to_json(), &g).unwrap();
    assert_eq!(back.hot_sets(), book_map.hot_sets());
}
