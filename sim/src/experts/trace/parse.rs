//! Helpers of the text readers: JSONL lines parsed one by one, a token's expert ids checked.

use super::{lines, TraceError};

/// Parses the non-blank lines of a JSONL reader as `T`, yielding 1-based line numbers. Lines
/// are bounded ([`lines::MAX_LINE_BYTES`], [`lines::MAX_BLANK_RUN`]): `/dev/zero` or one huge
/// line fails at line 1 without being held in memory.
pub(crate) fn jsonl_lines<'a, T, R>(
    reader: R,
    path: &'a str,
) -> impl Iterator<Item = Result<(u64, T), TraceError>> + 'a
where
    T: serde::de::DeserializeOwned,
    R: std::io::BufRead + 'a,
{
    lines::BoundedLines::new(reader, path).map(move |item| {
        let (lineno, l) = item?;
        serde_json::from_str(&l)
            .map(|v| (lineno, v))
            .map_err(|e| TraceError::malformed(path, lineno, e.to_string()))
    })
}

/// Checks the raw ids of one routed token at `path:line`: `-1` is skipped when `padding` allows
/// it, other negatives are malformed, ids at or above `experts` (when known) are out of range, an
/// id listed twice is a [`TraceError::DuplicateExpert`].
pub(crate) fn check_ids(
    raw: &[i64],
    experts: Option<u32>,
    padding: bool,
    path: &str,
    line: u64,
) -> Result<Vec<u32>, TraceError> {
    let mut ids = Vec::with_capacity(raw.len());
    for &e in raw {
        if e == -1 && padding {
            continue;
        }
        if e < 0 || e > u32::MAX as i64 {
            return Err(TraceError::malformed(
                path,
                line,
                format!("invalid expert id {e}"),
            ));
        }
        if let Some(experts) = experts {
            if e >= experts as i64 {
                return Err(TraceError::ExpertOutOfRange {
                    location: format!("{path}:{line}"),
                    expert: e as u64,
                    experts,
                });
            }
        }
        ids.push(e as u32);
    }
    if let Some(expert) = first_duplicate(&ids) {
        return Err(TraceError::DuplicateExpert {
            location: format!("{path}:{line}"),
            expert,
        });
    }
    Ok(ids)
}

/// The first id (in sorted order for long lists) that appears twice in `ids`, if any.
fn first_duplicate(ids: &[u32]) -> Option<u32> {
    if ids.len() <= 32 {
        // Top-k lists are short: a quadratic scan allocates nothing.
        return ids
            .iter()
            .enumerate()
            .find(|&(i, e)| ids[..i].contains(e))
            .map(|(_, &e)| e);
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_ids_within_a_token_are_rejected() {
        assert!(check_ids(&[1, 2, -1, -1], Some(4), true, "f", 3).is_ok());
        let e = check_ids(&[1, 2, 1], Some(4), false, "f", 3).unwrap_err();
        assert!(
            matches!(&e, TraceError::DuplicateExpert { expert: 1, location } if location == "f:3"),
            "{e}"
        );
        let long: Vec<i64> = (0..40).chain([7]).collect();
        assert!(matches!(
            check_ids(&long, None, false, "f", 1),
            Err(TraceError::DuplicateExpert { expert: 7, .. })
        ));
    }
}
