//! Figures fitted from the real OLMoE routing counts, written as numbers in code, and the fitting
//! code that reproduces them from `routing-counts.json`.
//!
//! Source: `../shared/data/moe/olmoe/routing-counts.json` (Apache-2.0, from allenai/OLMoE
//! `scripts/routing_output`): per text domain, top-8 pick counts per expert of OLMoE-1B-7B
//! (64 experts, 16 layers) at layers 0, 7 and 15 over 208,896 prefill tokens.
//!
//! How the constants were made: for each domain and anchor layer, `ppm[e] = round(picks[e] ·
//! 10^6 / Σ picks)` in integer arithmetic ([`shares_ppm`]). The test
//! `constants_match_routing_counts` recomputes every number from the JSON (when `../shared` is
//! present) and checks they are identical, so the numbers below cannot drift from the data.
//! The other 13 layers are not measured; [`super::synth::DomainProfile::from_anchors`] derives
//! them from these three profiles (documented there).

use super::TraceError;

/// OLMoE-1B-7B: MoE layers.
pub const OLMOE_LAYERS: u32 = 16;
/// OLMoE-1B-7B: experts per layer.
pub const OLMOE_EXPERTS: u32 = 64;
/// OLMoE-1B-7B: top-k.
pub const OLMOE_TOP_K: u32 = 8;
/// Domains of [`OLMOE_SHARES_PPM`], in its order.
pub const OLMOE_DOMAINS: [&str; 6] = ["arxiv", "book", "c4", "github", "tulu", "wikipedia"];

/// Anchor layers of the OLMoE counts (the layers `routing-counts.json` measured).
pub const OLMOE_ANCHOR_LAYERS: [u32; 3] = [0, 7, 15];

/// OLMoE-1B-7B top-8 pick shares per domain, anchor layer and expert id, in picks per million
/// (`round(picks[e] * 1e6 / sum(picks))`, integer rounding half up), fitted from
/// `moe/olmoe/routing-counts.json` (208,896 prefill tokens per domain; Apache-2.0, allenai/OLMoE).
/// Domain order: [`OLMOE_DOMAINS`].
#[rustfmt::skip]
pub const OLMOE_SHARES_PPM: [[[u32; 64]; 3]; 6] = [
    // arxiv
    [
        [
            122078, 11537, 11606, 19260, 23223, 9127, 20324, 13658, 10573, 5441, 8360, 16390, 3276, 12758, 9155, 13070,
            8155, 28167, 11314, 16458, 4296, 21064, 8147, 6011, 10552, 10156, 11297, 13692, 3475, 22143, 10788, 12243,
            15261, 10450, 14118, 9479, 21431, 12031, 14386, 7746, 39256, 24977, 14323, 13727, 15337, 15541, 13602, 19590,
            9837, 13948, 13605, 17864, 10853, 20632, 29307, 21778, 12923, 7837, 14721, 8564, 14854, 14301, 13811, 6117,
        ],
        [
            10464, 2569, 69185, 1564, 91898, 12682, 3846, 11289, 1938, 2760, 13040, 6544, 15307, 3191, 5974, 17689,
            8262, 98173, 1324, 9204, 4593, 34289, 7133, 16263, 20125, 814, 25218, 18218, 1453, 13926, 27048, 10183,
            13631, 15428, 8412, 64501, 30964, 5293, 24232, 12655, 4891, 12048, 11629, 2844, 781, 17530, 25822, 2452,
            18184, 13696, 4050, 928, 16115, 984, 4423, 2684, 13604, 7021, 61933, 13432, 4325, 10310, 2249, 6780,
        ],
        [
            15913, 39880, 10098, 20002, 4181, 8283, 10492, 14817, 25899, 7646, 8136, 12065, 7427, 8490, 11, 10283,
            8894, 117109, 3395, 12182, 12361, 19034, 4131, 2431, 5159, 1127, 22479, 355, 7320, 37861, 60388, 8632,
            13138, 17037, 64176, 29960, 48741, 11730, 3948, 11, 1982, 4982, 714, 24673, 38304, 917, 6674, 5448,
            1698, 125, 4459, 180, 6479, 30770, 9919, 14067, 10857, 21644, 52174, 85, 30385, 8109, 6962, 3170,
        ],
    ],
    // book
    [
        [
            727, 22365, 14840, 14330, 14647, 19039, 19840, 15906, 9785, 7306, 9783, 8040, 27094, 10315, 13707, 13848,
            19264, 11841, 12012, 19726, 32795, 1155, 14761, 4054, 4526, 13451, 14699, 16104, 56750, 10194, 10362, 13959,
            15152, 16780, 2102, 19233, 19245, 12323, 16520, 16501, 17011, 39398, 19668, 14747, 10046, 16456, 22115, 16423,
            15804, 17175, 13228, 5545, 9852, 13191, 14930, 15414, 19542, 17008, 39086, 17132, 11516, 11722, 18770, 9143,
        ],
        [
            2525, 4955, 4103, 53113, 3907, 12685, 13485, 4331, 27414, 21040, 14484, 8413, 7543, 1857, 20060, 2382,
            8741, 2504, 10205, 16514, 21788, 10635, 15110, 25614, 9316, 11973, 7737, 3784, 63393, 11077, 16204, 9796,
            13386, 5481, 12583, 3414, 6568, 8961, 11457, 7403, 17585, 23707, 15671, 4430, 41919, 9646, 12390, 3020,
            26258, 11083, 24592, 22958, 15384, 9508, 25254, 62212, 25200, 21815, 10693, 1709, 22253, 15632, 42112, 19029,
        ],
        [
            10361, 7032, 29774, 6384, 15040, 1407, 8714, 41379, 1713, 3519, 32942, 14074, 16146, 35139, 45673, 31232,
            16277, 1845, 1103, 3653, 10322, 23661, 22780, 19015, 2892, 9364, 36147, 10973, 26584, 7561, 891, 12370,
            2476, 2360, 455, 7523, 7016, 4685, 22886, 38396, 13111, 6868, 1474, 8121, 3880, 45748, 29208, 25019,
            18799, 20595, 29805, 1735, 13488, 7091, 24021, 17320, 27151, 6692, 12558, 9670, 14945, 16678, 30609, 23649,
        ],
    ],
    // c4
    [
        [
            9186, 13028, 12467, 14608, 14139, 15942, 17475, 15990, 11916, 23694, 15866, 20853, 16037, 12501, 13819, 15646,
            15902, 18388, 13244, 19208, 15824, 10494, 20496, 4682, 17898, 14029, 16636, 13037, 11388, 15720, 16175, 13135,
            12274, 16903, 13771, 14112, 16238, 14742, 16986, 15547, 13556, 47134, 13107, 15095, 15667, 13499, 18272, 13557,
            15526, 14712, 15163, 19808, 11174, 11765, 12470, 15125, 12673, 21177, 23468, 16092, 17332, 17088, 13386, 13157,
        ],
        [
            20114, 41529, 3131, 9901, 11014, 23648, 12429, 6536, 11481, 11949, 12200, 11860, 9882, 20163, 13585, 20079,
            14409, 6576, 33474, 17876, 16579, 9011, 15645, 20130, 16196, 26133, 19908, 10783, 9368, 16731, 17638, 19048,
            14651, 18687, 12202, 8461, 15240, 15777, 19162, 12236, 13893, 18577, 9699, 12439, 15549, 7758, 26191, 20510,
            20815, 11284, 12327, 9685, 16950, 23397, 11853, 12197, 19117, 16272, 8289, 22425, 17860, 17694, 14823, 14973,
        ],
        [
            12905, 6415, 27267, 20154, 14955, 11677, 8170, 39049, 9686, 4631, 23760, 7951, 7094, 24576, 12992, 23244,
            7673, 10659, 6963, 5511, 16381, 33748, 12007, 20648, 9974, 33295, 29536, 26156, 18430, 6510, 10086, 13996,
            3903, 2973, 8231, 9090, 12047, 5627, 20346, 19963, 13804, 14093, 20506, 10627, 3567, 16109, 21618, 17963,
            20228, 23266, 8772, 26361, 17910, 9344, 20933, 22794, 25394, 8714, 14446, 16257, 14409, 19854, 18518, 16234,
        ],
    ],
    // github
    [
        [
            19371, 11850, 22792, 15832, 14136, 5825, 24883, 9809, 21307, 2607, 10135, 22089, 2785, 22495, 10743, 14131,
            7559, 24615, 11882, 8169, 12114, 78223, 10530, 5986, 19875, 11733, 11630, 15629, 10563, 18603, 13371, 15929,
            17876, 12127, 4621, 8143, 13456, 12270, 7860, 10140, 37829, 28308, 15465, 12874, 12237, 9660, 7986, 21611,
            8864, 17498, 13249, 15982, 22303, 31451, 21648, 16043, 16543, 3793, 13526, 10979, 18702, 17329, 16793, 15633,
        ],
        [
            48452, 14012, 94447, 3243, 82097, 7934, 3001, 14488, 2331, 3174, 10136, 3463, 21739, 9824, 9746, 5851,
            6212, 96197, 6037, 3356, 3053, 28033, 6803, 21637, 7086, 4208, 21066, 30526, 2100, 9425, 16049, 19094,
            8931, 13434, 8276, 71733, 5667, 7904, 7394, 16481, 3566, 4849, 24317, 6464, 483, 45392, 20781, 3936,
            22896, 17894, 1057, 198, 6980, 816, 4284, 2425, 17005, 1382, 39082, 6220, 1871, 6230, 2608, 4618,
        ],
        [
            18461, 49942, 3074, 9925, 2913, 20109, 22174, 2580, 70214, 18843, 1772, 16404, 13781, 1762, 111, 1791,
            18525, 68724, 16736, 20412, 6537, 3141, 10560, 2990, 20968, 261, 1947, 1171, 1650, 39562, 70447, 16898,
            24933, 25532, 8332, 21754, 57507, 20146, 1316, 644, 13454, 14422, 8638, 21382, 49553, 180, 1599, 1933,
            1125, 405, 7753, 2726, 12834, 18683, 1409, 2455, 1929, 22977, 58995, 480, 37571, 811, 1165, 2971,
        ],
    ],
    // tulu
    [
        [
            28958, 10426, 11261, 14279, 14012, 11749, 10028, 12653, 19306, 12648, 12014, 24283, 6683, 18830, 10158, 12698,
            10795, 20722, 16269, 12766, 12497, 50529, 14342, 36167, 21031, 12756, 12759, 13266, 8120, 17125, 14206, 14030,
            11313, 15355, 12389, 10783, 13352, 10952, 13753, 12197, 23105, 37295, 14183, 15156, 13951, 9870, 11495, 12977,
            12793, 14845, 16813, 19553, 15011, 20839, 16491, 14192, 11297, 5179, 14912, 13995, 18772, 17094, 11672, 21049,
        ],
        [
            30137, 27316, 40963, 7196, 58171, 18010, 6430, 8081, 4166, 6903, 10595, 8335, 12544, 12628, 12297, 21467,
            9894, 69552, 14302, 10930, 10930, 18977, 14368, 21959, 14228, 8115, 23459, 29859, 5842, 14736, 28511, 13158,
            13230, 6956, 10079, 36995, 17708, 7279, 20396, 16443, 4468, 14703, 7284, 4675, 3950, 19912, 25765, 4588,
            22465, 13354, 3579, 2115, 9642, 11544, 13507, 6653, 18632, 7719, 22644, 15540, 14325, 14667, 6606, 8516,
        ],
        [
            16194, 30158, 15643, 15572, 9417, 11237, 17191, 20839, 57075, 6842, 12688, 7827, 11172, 12758, 5674, 11008,
            5364, 63925, 3647, 8435, 17494, 20428, 8100, 9143, 11520, 10864, 10485, 8974, 8779, 25931, 64655, 16435,
            9507, 9148, 25959, 17711, 36593, 11232, 6874, 5298, 6531, 8009, 7944, 16608, 21892, 6500, 11597, 10440,
            6079, 5588, 4652, 8324, 14698, 16959, 11255, 14307, 14315, 26989, 45537, 3907, 30820, 10402, 7936, 10914,
        ],
    ],
    // wikipedia
    [
        [
            9795, 11743, 5592, 47066, 38916, 6111, 10953, 10752, 8094, 2662, 11458, 96540, 17138, 10352, 7038, 7413,
            8873, 56919, 8373, 17376, 8997, 11180, 11642, 5269, 15919, 8265, 14864, 6013, 13853, 18892, 12449, 16009,
            13878, 10339, 13981, 14699, 9955, 16538, 5254, 5338, 17147, 19098, 24052, 10408, 14030, 15991, 14663, 15437,
            19506, 11377, 19161, 45766, 11343, 11710, 8707, 14739, 17657, 18640, 8280, 7164, 16287, 11194, 12337, 8807,
        ],
        [
            10908, 18694, 3121, 20289, 26044, 12670, 3911, 4046, 2363, 5275, 7804, 12663, 21667, 17837, 9851, 3827,
            8172, 4386, 27073, 10942, 5108, 16542, 37262, 14395, 10339, 2669, 14231, 105945, 995, 11880, 30721, 54749,
            6671, 31834, 6041, 18477, 7763, 15663, 19759, 10937, 17453, 8675, 29653, 33326, 16921, 9735, 20808, 22947,
            15353, 55194, 3149, 1997, 12746, 4448, 3393, 6583, 11399, 5254, 22578, 10946, 4414, 9295, 10092, 10119,
        ],
        [
            66740, 37374, 2178, 24689, 565, 1746, 58810, 14927, 29487, 6100, 1589, 3298, 31115, 1633, 3422, 1723,
            8617, 14741, 1561, 1335, 2640, 2799, 1662, 4360, 18994, 1559, 4798, 4763, 1424, 14291, 14435, 53148,
            1829, 2500, 2449, 35518, 72668, 2247, 2110, 1078, 10265, 55532, 5153, 54577, 3758, 1725, 1442, 8346,
            6035, 20060, 938, 793, 15269, 25339, 1794, 3089, 2192, 67802, 58405, 11420, 47332, 2021, 1408, 38382,
        ],
    ],
];

/// Integer pick shares in parts per million: `round(c · 10^6 / Σ c)`, half up.
pub fn shares_ppm(counts: &[u64]) -> Vec<u32> {
    let total: u64 = counts.iter().sum();
    counts
        .iter()
        .map(|&c| {
            if total == 0 {
                0
            } else {
                ((c as u128 * 1_000_000 + total as u128 / 2) / total as u128) as u32
            }
        })
        .collect()
}

/// The in-code OLMoE anchor profiles of one domain: `(layer, shares per expert id)` for layers 0,
/// 7 and 15, each share vector of length 64 summing to 1.
///
/// # Errors
/// [`TraceError::InvalidScenario`] for a domain not in [`OLMOE_DOMAINS`].
pub fn olmoe_anchor_shares(domain: &str) -> Result<Vec<(u32, Vec<f64>)>, TraceError> {
    let d = OLMOE_DOMAINS
        .iter()
        .position(|&x| x == domain)
        .ok_or_else(|| {
            TraceError::InvalidScenario(format!(
                "unknown OLMoE domain {domain:?} (known: {})",
                OLMOE_DOMAINS.join(", ")
            ))
        })?;
    Ok(OLMOE_ANCHOR_LAYERS
        .iter()
        .zip(OLMOE_SHARES_PPM[d].iter())
        .map(|(&layer, ppm)| {
            let total: u32 = ppm.iter().sum();
            (
                layer,
                ppm.iter().map(|&v| v as f64 / total as f64).collect(),
            )
        })
        .collect())
}

/// Raw per-expert pick counts of one model and domain from a parsed `routing-counts.json`:
/// `(layer, counts per expert id)` per measured layer, each of length `experts`.
///
/// # Errors
/// [`TraceError::InvalidScenario`] when the model, domain or fields are missing or an expert id
/// is not an integer below `experts`; [`TraceError::TooLarge`] for `experts` above
/// [`expert_residency::MAX_EXPERTS_PER_LAYER`].
pub fn routing_counts(
    json: &serde_json::Value,
    model: &str,
    domain: &str,
    experts: u32,
) -> Result<Vec<(u32, Vec<u64>)>, TraceError> {
    let bad = |what: String| TraceError::InvalidScenario(format!("routing counts: {what}"));
    let d = json
        .get(model)
        .ok_or_else(|| bad(format!("no model {model:?}")))?
        .get(domain)
        .ok_or_else(|| bad(format!("no domain {domain:?} for model {model:?}")))?;
    let layers = d
        .get("layers")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("no `layers` array".into()))?;
    let counts = d
        .get("topk_counts")
        .and_then(|v| v.as_array())
        .ok_or_else(|| bad("no `topk_counts` array".into()))?;
    if layers.len() != counts.len() {
        return Err(bad("`layers` and `topk_counts` differ in length".into()));
    }
    if experts > expert_residency::MAX_EXPERTS_PER_LAYER {
        return Err(TraceError::TooLarge(format!(
            "routing counts: {experts} experts per layer exceed the limit of {}",
            expert_residency::MAX_EXPERTS_PER_LAYER
        )));
    }
    let mut out = Vec::new();
    for (l, c) in layers.iter().zip(counts) {
        let layer = l
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad(format!("layer {l} is not an integer in 0..=2^32-1")))?;
        let obj = c
            .as_object()
            .ok_or_else(|| bad("a `topk_counts` entry is not an object".into()))?;
        let mut v = vec![0u64; experts as usize];
        for (k, n) in obj {
            let e: u32 = k
                .parse()
                .map_err(|_| bad(format!("expert id {k:?} is not an integer")))?;
            if e >= experts {
                return Err(bad(format!("expert id {e} not below {experts}")));
            }
            v[e as usize] = n
                .as_u64()
                .ok_or_else(|| bad(format!("count of expert {e} is not an integer")))?;
        }
        out.push((layer, v));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_code_profiles_are_normalised() {
        for d in OLMOE_DOMAINS {
            for (_, shares) in olmoe_anchor_shares(d).unwrap() {
                assert_eq!(shares.len(), 64);
                assert!((shares.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            }
        }
        assert!(olmoe_anchor_shares("poetry").is_err());
    }

    #[test]
    fn constants_match_routing_counts() {
        let Some(shared) = crate::experts::trace::test_util::shared_dir("OLMoE constants check")
        else {
            return;
        };
        let text =
            std::fs::read_to_string(shared.join("data/moe/olmoe/routing-counts.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        for (d, domain) in OLMOE_DOMAINS.iter().enumerate() {
            let counts = routing_counts(&json, "olmoe", domain, OLMOE_EXPERTS).unwrap();
            assert_eq!(counts.len(), 3);
            for (a, (layer, c)) in counts.iter().enumerate() {
                assert_eq!(*layer, OLMOE_ANCHOR_LAYERS[a]);
                assert_eq!(
                    shares_ppm(c),
                    OLMOE_SHARES_PPM[d][a].to_vec(),
                    "{domain} layer {layer}"
                );
            }
        }
        assert!(routing_counts(&json, "olmoe", "github", 32).is_err());
        assert!(routing_counts(&json, "nope", "github", 64).is_err());
    }
}
