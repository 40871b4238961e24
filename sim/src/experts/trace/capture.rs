//! Reader for per-request routing captures: the expert ids an engine returns with each request
//! when asked to, `[tokens, layers, top_k]` per request ([`super::TraceFormat::CaptureJson`]).
//!
//! Sources (read from their public code; the test files here are written by this crate's tests):
//! - **vLLM** `--enable-return-routed-experts` (PR #28284; `routed_experts_capturer.py`, vLLM
//!   0.34): every MoE layer's `topk_ids` are captured into a `[tokens, num_hidden_layers,
//!   num_experts_per_tok]` int32 buffer indexed by KV slot, and a finished request's rows are
//!   attached as `CompletionOutput.routed_experts` (a NumPy array; one row per token from the
//!   first prompt token to the last token fed back, so the last generated token has none). The
//!   OpenAI-compatible server returns them per choice as `choices[i].routed_experts` and, in later
//!   versions, the prompt's part at the response level as `prompt_routed_experts`, each either a
//!   nested list or a base64 string of an `np.save` file (`.npy`).
//! - **SGLang** `--enable-return-routed-experts` with `"return_routed_experts": true` per request
//!   (PR #12162; `routed_experts_capturer.py`): `/generate` returns
//!   `meta_info.routed_experts`, a base64 string of the raw little-endian int32 buffer, logical
//!   shape `[prompt_tokens + completion_tokens - 1, num_hidden_layers, num_experts_per_tok]`
//!   (`meta_info.prompt_tokens` / `completion_tokens` say how many); the OpenAI endpoints return
//!   the same under `choices[i].routed_experts` or `choices[i].sgl_ext.routed_experts`. A raw
//!   buffer carries no shape: give [`ReadOptions::layers`] (`--layers`, the model's
//!   `num_hidden_layers`) and [`ReadOptions::top_k`] (`--top-k`, `num_experts_per_tok`).
//!
//! Accepted files: one response object, a JSON array of them, or JSONL (one per line; any
//! whitespace-separated JSON values); a response may also be a bare nested list `[tokens][layers]
//! [top_k]` (`routed_experts.tolist()` dumped as is), or an array of such lists (one per request).
//! Read keys (unknown keys are ignored): `routed_experts`, `prompt_routed_experts`, `meta_info`
//! (`routed_experts`, `prompt_tokens`, `completion_tokens`), `choices[]` / `outputs[]`
//! (`routed_experts`, `sgl_ext.routed_experts`), `usage.prompt_tokens`, `prompt_tokens`,
//! `prompt_token_ids` (its length).
//!
//! **Steps.** Requests follow one another (batch 1, in file order). A request's prompt is one
//! prefill step (every prompt token's picks in each layer) and each later token one decode step:
//! the prompt is `prompt_routed_experts` when given, else the first `P` rows where `P` is the
//! prompt length (`meta_info.prompt_tokens`, `usage.prompt_tokens`, `prompt_tokens` or the
//! length of `prompt_token_ids`) — unless the rows are no more than the completion's tokens
//! (`completion_tokens`), which then hold no prompt row; without a prompt length every token is
//! its own step (a note says so). With several choices, the prompt is one step before the first
//! choice's tokens.
//!
//! **Rows.** A `-1` id is padding and skipped. A token's row in a layer that names no routed
//! expert (every id `-1`, or every id equal with top-k > 1: the zero-filled rows of dense
//! layers, which both engines capture too) is skipped and counted
//! ([`ReadReport::padding_rows`]). The trace keeps the capture's layer axis (`num_hidden_layers`);
//! dense layers have no picks.

use super::lines::{open_document, PickBudget, MAX_PICKS};
use super::tensor::{tensor_from_seq, Tensor, MAX_TENSOR_VALUES};
use super::{ReadOptions, ReadReport, StepPicks, Trace, TraceError, TraceFormat, TraceShape};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::path::Path;

/// A routed-experts payload: a nested list, or a base64 string (raw int32 or `.npy`).
#[derive(Debug)]
enum Routed {
    Nested(Tensor),
    Encoded(String),
}

impl<'de> serde::Deserialize<'de> for Routed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Routed;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a nested list of expert ids or a base64 string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Routed, E> {
                Ok(Routed::Encoded(s.to_string()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Routed, E> {
                Ok(Routed::Encoded(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Routed, A::Error> {
                tensor_from_seq(seq).map(Routed::Nested)
            }
        }
        d.deserialize_any(V)
    }
}

/// Counts the elements of an array without holding them.
#[derive(Debug, Default)]
struct Len(u64);

impl<'de> serde::Deserialize<'de> for Len {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Len;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Len, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Len(n))
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Debug, Default, serde::Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

/// A response, a choice, `meta_info` or `sgl_ext`: every key any of them may hold.
#[derive(Debug, Default, serde::Deserialize)]
struct Part {
    routed_experts: Option<Routed>,
    prompt_routed_experts: Option<Routed>,
    meta_info: Option<Box<Part>>,
    sgl_ext: Option<Box<Part>>,
    choices: Option<Vec<Part>>,
    outputs: Option<Vec<Part>>,
    usage: Option<Usage>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_token_ids: Option<Len>,
}

/// One top-level JSON value of the file.
#[derive(Debug)]
enum Item {
    Response(Box<Part>),
    /// A bare nested list: one request (`[tokens, layers, top_k]`) or one token (`[layers,
    /// top_k]`, inside a top-level array).
    Tensor(Tensor),
    List(Vec<Item>),
}

impl<'de> serde::Deserialize<'de> for Item {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ItemVisitor { top: true })
    }
}

struct ItemVisitor {
    top: bool,
}

impl<'de> Visitor<'de> for ItemVisitor {
    type Value = Item;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a response object or a nested list of expert ids")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Item, A::Error> {
        let part = Part::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(Item::Response(Box::new(part)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Item, A::Error> {
        if !self.top {
            return tensor_from_seq(seq).map(Item::Tensor);
        }
        let mut items = Vec::new();
        while let Some(it) = seq.next_element_seed(ElemSeed)? {
            items.push(it);
        }
        Ok(Item::List(items))
    }
}

struct ElemSeed;

impl<'de> de::DeserializeSeed<'de> for ElemSeed {
    type Value = Item;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Item, D::Error> {
        d.deserialize_any(ItemVisitor { top: false })
    }
}

use serde::Deserialize as _;

/// Expert ids `[tokens, layers, top_k]`, row-major.
struct Ids {
    tokens: usize,
    layers: usize,
    k: usize,
    values: Vec<i64>,
}

/// Reads a capture file (see the module docs) into a trace, with its [`ReadReport`].
///
/// # Errors
/// [`TraceError::Io`]; [`TraceError::TooLarge`] for a file above
/// [`super::lines::MAX_DOCUMENT_BYTES`], an array above [`MAX_TENSOR_VALUES`] numbers, more than
/// [`MAX_PICKS`] picks or a shape above the bounds; [`TraceError::Malformed`] for invalid JSON
/// (with its line), a payload that is not `[tokens, layers, top_k]`, bad base64, an `.npy`
/// payload of another dtype or a broken header, a raw payload without `--layers`/`--top-k` or
/// not a multiple of them, an id that is not an integer; [`TraceError::ExpertOutOfRange`],
/// [`TraceError::DuplicateExpert`] naming the request, token and layer;
/// [`TraceError::ShapeMismatch`] for requests of different layer counts or a layer count other
/// than `--layers`; [`TraceError::Empty`] for no routed expert at all.
pub fn read_capture(path: &Path, opts: &ReadOptions) -> Result<(Trace, ReadReport), TraceError> {
    let p = path.display().to_string();
    let (head, rest) = open_document(path, 0)?;
    let reader = std::io::Read::chain(std::io::Cursor::new(head), rest);
    let name = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("capture")
        .to_string();
    read_capture_from(reader, &p, opts, name)
}

/// As [`read_capture`], from any reader; `path` names it in errors, `name` is the trace's name.
///
/// # Errors
/// As [`read_capture`].
pub fn read_capture_from<R: std::io::Read>(
    reader: R,
    path: &str,
    opts: &ReadOptions,
    name: String,
) -> Result<(Trace, ReadReport), TraceError> {
    let mut b = Builder::new(path, opts);
    let stream = serde_json::Deserializer::from_reader(std::io::BufReader::new(reader));
    for item in stream.into_iter::<Item>() {
        let item = item.map_err(|e| {
            let m = e.to_string();
            if m.contains("more than") && m.contains("numbers in one array") {
                TraceError::TooLarge(format!("{path}:{}: {m}", e.line()))
            } else {
                TraceError::malformed(path, e.line() as u64, m)
            }
        })?;
        b.item(item)?;
    }
    b.finish(name)
}

/// Turns requests into steps as they come.
struct Builder<'a> {
    path: &'a str,
    opts: &'a ReadOptions,
    layers: Option<usize>,
    max_id: Option<u32>,
    max_width: usize,
    requests: u64,
    steps: Vec<StepPicks>,
    report: ReadReport,
    budget: PickBudget,
    unknown_prompt: u64,
}

impl<'a> Builder<'a> {
    fn new(path: &'a str, opts: &'a ReadOptions) -> Self {
        Builder {
            path,
            opts,
            layers: opts.layers.map(|l| l as usize),
            max_id: None,
            max_width: 0,
            requests: 0,
            steps: Vec::new(),
            report: ReadReport::of(TraceFormat::CaptureJson),
            budget: PickBudget::default(),
            unknown_prompt: 0,
        }
    }

    fn malformed(&self, m: String) -> TraceError {
        TraceError::Malformed {
            path: self.path.to_string(),
            line: 0,
            reason: format!("request {}: {m}", self.requests),
        }
    }

    fn item(&mut self, item: Item) -> Result<(), TraceError> {
        match item {
            Item::Response(p) => self.response(*p),
            Item::Tensor(t) => {
                let ids = self.nested(t)?;
                self.request(None, ids, None)
            }
            Item::List(items) => {
                if items
                    .iter()
                    .all(|i| matches!(i, Item::Tensor(t) if t.shape.len() == 2))
                    && !items.is_empty()
                {
                    // One request written as a top-level list of tokens.
                    let mut stacked = Tensor::default();
                    let mut inner: Option<Vec<usize>> = None;
                    let n = items.len();
                    for it in items {
                        let Item::Tensor(t) = it else { unreachable!() };
                        if inner.as_ref().is_some_and(|s| *s != t.shape) {
                            return Err(self.malformed(format!(
                                "tokens of shapes {:?} and {:?}",
                                inner.unwrap_or_default(),
                                t.shape
                            )));
                        }
                        inner = Some(t.shape.clone());
                        if stacked.values.len() + t.values.len() > MAX_TENSOR_VALUES {
                            return Err(TraceError::TooLarge(format!(
                                "{}: more than {MAX_TENSOR_VALUES} ids in one request",
                                self.path
                            )));
                        }
                        stacked.values.extend(t.values);
                    }
                    stacked.shape = std::iter::once(n)
                        .chain(inner.unwrap_or_default())
                        .collect();
                    let ids = self.nested(stacked)?;
                    return self.request(None, ids, None);
                }
                for it in items {
                    match it {
                        Item::List(_) => {
                            return Err(self.malformed("a list nested in a list of requests".into()))
                        }
                        other => self.item(other)?,
                    }
                }
                Ok(())
            }
        }
    }

    fn response(&mut self, p: Part) -> Result<(), TraceError> {
        let meta = p.meta_info.as_deref();
        let prompt_len = meta
            .and_then(|m| m.prompt_tokens)
            .or(p.usage.as_ref().and_then(|u| u.prompt_tokens))
            .or(p.prompt_tokens)
            .or(p.prompt_token_ids.as_ref().map(|l| l.0));
        let completion_len = meta
            .and_then(|m| m.completion_tokens)
            .or(p.usage.as_ref().and_then(|u| u.completion_tokens))
            .or(p.completion_tokens);
        let mut prompt = match p.prompt_routed_experts {
            Some(r) => Some(self.decode(r)?),
            None => None,
        };
        let mut bodies = Vec::new();
        for c in p.choices.into_iter().chain(p.outputs).flatten() {
            let routed = c
                .routed_experts
                .or(c.sgl_ext.and_then(|s| s.routed_experts))
                .or(c.meta_info.and_then(|m| m.routed_experts));
            if let Some(r) = routed {
                bodies.push(r);
            }
        }
        if let Some(r) = p.routed_experts {
            bodies.push(r);
        }
        if let Some(r) = p.meta_info.and_then(|m| m.routed_experts) {
            bodies.push(r);
        }
        if bodies.is_empty() && prompt.is_none() {
            return Err(self.malformed(
                "no routed experts: expected `routed_experts` (top level, `meta_info`, \
                 `choices[]`, `choices[].sgl_ext`) or `prompt_routed_experts`; was the server \
                 started with --enable-return-routed-experts (and, for SGLang, the request sent \
                 with \"return_routed_experts\": true)?"
                    .into(),
            ));
        }
        if bodies.is_empty() {
            let ids = prompt.take().expect("checked above");
            return self.request(None, ids, Some(u64::MAX));
        }
        for (i, r) in bodies.into_iter().enumerate() {
            let ids = self.decode(r)?;
            let pre = if i == 0 { prompt.take() } else { None };
            // A body no longer than the completion holds no prompt row (vLLM's split form, the
            // prompt's part not asked for).
            let completion_only = completion_len.is_some_and(|c| ids.tokens as u64 <= c);
            let len = if i == 0 && !completion_only {
                prompt_len
            } else {
                Some(0)
            };
            self.request(pre, ids, len)?;
        }
        Ok(())
    }

    fn decode(&self, r: Routed) -> Result<Ids, TraceError> {
        match r {
            Routed::Nested(t) => self.nested(t),
            Routed::Encoded(s) => self.encoded(&s),
        }
    }

    fn nested(&self, t: Tensor) -> Result<Ids, TraceError> {
        let (tokens, layers, k) = match t.shape.as_slice() {
            [t, l, k] => (*t, *l, *k),
            [l, k] => (1, *l, *k),
            [0] => (0, 0, 0),
            s => {
                return Err(self.malformed(format!(
                    "routed experts of shape {s:?}: expected [tokens, layers, top_k]"
                )))
            }
        };
        let mut values = Vec::with_capacity(t.values.len());
        for v in t.values {
            if v.fract() != 0.0 || !(-1.0..=u32::MAX as f64).contains(&v) {
                return Err(self.malformed(format!("{v} is not an expert id")));
            }
            values.push(v as i64);
        }
        Ok(Ids {
            tokens,
            layers,
            k,
            values,
        })
    }

    fn encoded(&self, s: &str) -> Result<Ids, TraceError> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .map_err(|e| self.malformed(format!("routed experts: not base64 ({e})")))?;
        if bytes.starts_with(b"\x93NUMPY") {
            return self.npy(&bytes);
        }
        if bytes.len() % 4 != 0 {
            return Err(self.malformed(format!(
                "a raw int32 routed-experts buffer of {} bytes (not a multiple of 4)",
                bytes.len()
            )));
        }
        let n = bytes.len() / 4;
        let (Some(l), Some(k)) = (self.opts.layers, self.opts.top_k) else {
            return Err(self.malformed(
                "a raw base64 int32 buffer (SGLang) carries no shape: give --layers (the \
                 model's num_hidden_layers) and --top-k (num_experts_per_tok)"
                    .into(),
            ));
        };
        let row = (l as usize).saturating_mul(k as usize).max(1);
        if n % row != 0 {
            return Err(self.malformed(format!(
                "{n} ids are not a whole number of tokens of {l} layers × top-{k}; check \
                 --layers (num_hidden_layers) and --top-k"
            )));
        }
        if n > MAX_TENSOR_VALUES {
            return Err(TraceError::TooLarge(format!(
                "{}: request {}: {n} ids, more than {MAX_TENSOR_VALUES}",
                self.path, self.requests
            )));
        }
        let values = bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect();
        Ok(Ids {
            tokens: n / row,
            layers: l as usize,
            k: k as usize,
            values,
        })
    }

    /// An `np.save` payload (vLLM): a 3-D (or 2-D) integer array.
    fn npy(&self, bytes: &[u8]) -> Result<Ids, TraceError> {
        let bad = |m: String| self.malformed(format!("routed experts .npy payload: {m}"));
        // Bound the header before the library reads it: magic (6), version (2), length (2 or 4).
        let (len_bytes, start) = match bytes.get(6) {
            Some(1) => (2, 10),
            Some(2 | 3) => (4, 12),
            v => return Err(bad(format!("unsupported version {v:?}"))),
        };
        let header_len = bytes
            .get(8..8 + len_bytes)
            .map(|b| b.iter().rev().fold(0usize, |a, &x| (a << 8) | x as usize))
            .ok_or_else(|| bad("truncated header".into()))?;
        if header_len > 4096 || start + header_len > bytes.len() {
            return Err(bad(format!("header of {header_len} bytes")));
        }
        let header = &bytes[start..start + header_len];
        let mut depth = 0i32;
        for &c in header {
            depth += match c {
                b'(' | b'[' | b'{' => 1,
                b')' | b']' | b'}' => -1,
                _ => 0,
            };
            if depth > 4 {
                return Err(bad("header nested too deeply".into()));
            }
        }
        let file = npyz::NpyFile::new(bytes).map_err(|e| bad(e.to_string()))?;
        let shape: Vec<u64> = file.shape().to_vec();
        if file.order() != npyz::Order::C {
            return Err(bad("Fortran order; save it in C order".into()));
        }
        let (tokens, layers, k) = match shape.as_slice() {
            [t, l, k] => (*t, *l, *k),
            [l, k] => (1, *l, *k),
            s => {
                return Err(bad(format!(
                    "shape {s:?}: expected [tokens, layers, top_k]"
                )))
            }
        };
        let n = tokens
            .checked_mul(layers)
            .and_then(|x| x.checked_mul(k))
            .filter(|&n| n <= MAX_TENSOR_VALUES as u64)
            .ok_or_else(|| bad(format!("shape {shape:?} is too large")))?;
        let size = match file.dtype() {
            npyz::DType::Plain(ts) => ts.num_bytes(),
            _ => None,
        }
        .ok_or_else(|| bad(format!("dtype {:?} is not an integer type", file.dtype())))?;
        let data_len = bytes.len() - start - header_len;
        if n.checked_mul(size as u64) != Some(data_len as u64) {
            return Err(bad(format!(
                "shape {shape:?} of {size}-byte ids needs {} data bytes, {data_len} present",
                n.saturating_mul(size as u64)
            )));
        }
        let values: Vec<i64> = match file.dtype() {
            npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::Int => match size {
                8 => file.into_vec::<i64>().map_err(|e| bad(e.to_string()))?,
                4 => to_i64(file.into_vec::<i32>()).map_err(|e| bad(e.to_string()))?,
                2 => to_i64(file.into_vec::<i16>()).map_err(|e| bad(e.to_string()))?,
                1 => to_i64(file.into_vec::<i8>()).map_err(|e| bad(e.to_string()))?,
                _ => return Err(bad(format!("{size}-byte integers"))),
            },
            npyz::DType::Plain(ts) if ts.type_char() == npyz::TypeChar::Uint => match size {
                4 => to_i64(file.into_vec::<u32>()).map_err(|e| bad(e.to_string()))?,
                2 => to_i64(file.into_vec::<u16>()).map_err(|e| bad(e.to_string()))?,
                1 => to_i64(file.into_vec::<u8>()).map_err(|e| bad(e.to_string()))?,
                _ => return Err(bad(format!("unsigned {size}-byte integers"))),
            },
            d => return Err(bad(format!("dtype {d:?} is not an integer type"))),
        };
        Ok(Ids {
            tokens: tokens as usize,
            layers: layers as usize,
            k: k as usize,
            values,
        })
    }

    /// Adds one request: its prompt as one prefill step (`prompt`, else the first `prompt_len`
    /// rows of `body`), then one decode step per remaining token. `prompt_len == Some(u64::MAX)`
    /// marks a request that is all prompt.
    fn request(
        &mut self,
        prompt: Option<Ids>,
        body: Ids,
        prompt_len: Option<u64>,
    ) -> Result<(), TraceError> {
        let r = self.requests;
        self.requests += 1;
        let path = self.path;
        for ids in prompt.iter().chain(std::iter::once(&body)) {
            let cells = ids
                .tokens
                .checked_mul(ids.layers)
                .and_then(|x| x.checked_mul(ids.k));
            if cells != Some(ids.values.len()) {
                return Err(self.malformed(format!(
                    "{} ids for [{}, {}, {}]",
                    ids.values.len(),
                    ids.tokens,
                    ids.layers,
                    ids.k
                )));
            }
            if ids.tokens == 0 {
                continue;
            }
            match self.layers {
                None => self.layers = Some(ids.layers),
                Some(l) if l != ids.layers => {
                    return Err(TraceError::ShapeMismatch(format!(
                        "{path}: request {r} routes {} layers, {l} expected (--layers or an \
                         earlier request)",
                        ids.layers
                    )))
                }
                _ => {}
            }
            self.budget.charge(ids.values.len(), path, r)?;
            if let Some(k) = self.opts.top_k {
                if ids.k > k as usize {
                    return Err(TraceError::TopKTooWide {
                        location: format!("{path}: request {r}"),
                        found: ids.k as u64,
                        allowed: k,
                    });
                }
            }
        }
        if let Some(p) = prompt {
            if p.tokens > 0 {
                let step = self.step(&p, 0..p.tokens, r)?;
                self.steps.push(step);
            }
            for t in 0..body.tokens {
                let step = self.step(&body, t..t + 1, r)?;
                self.steps.push(step);
            }
            return Ok(());
        }
        let split = match prompt_len {
            Some(u64::MAX) => body.tokens,
            Some(p) if p as usize <= body.tokens => p as usize,
            Some(_) | None => {
                self.unknown_prompt += 1;
                0
            }
        };
        if split > 0 {
            let step = self.step(&body, 0..split, r)?;
            self.steps.push(step);
        }
        for t in split..body.tokens {
            let step = self.step(&body, t..t + 1, r)?;
            self.steps.push(step);
        }
        Ok(())
    }

    /// One step: tokens `range` of `ids`, every layer.
    fn step(
        &mut self,
        ids: &Ids,
        range: std::ops::Range<usize>,
        r: u64,
    ) -> Result<StepPicks, TraceError> {
        let experts = self.opts.experts_per_layer;
        let mut step = StepPicks {
            layers: vec![Vec::new(); ids.layers],
        };
        for t in range {
            for (l, out) in step.layers.iter_mut().enumerate() {
                let row = &ids.values[(t * ids.layers + l) * ids.k..][..ids.k];
                self.report.rows.rows += 1;
                let live: Vec<i64> = row.iter().copied().filter(|&e| e != -1).collect();
                let padding = live.is_empty()
                    || (ids.k > 1 && live.len() == ids.k && live.iter().all(|&e| e == live[0]));
                if padding {
                    self.report.padding_rows += 1;
                    continue;
                }
                let at = || format!("{}: request {r} token {t} layer {l}", self.path);
                for (i, &e) in live.iter().enumerate() {
                    if e < 0 {
                        return Err(TraceError::Malformed {
                            path: self.path.to_string(),
                            line: 0,
                            reason: format!("request {r} token {t} layer {l}: expert id {e}"),
                        });
                    }
                    if let Some(x) = experts {
                        if e >= x as i64 {
                            return Err(TraceError::ExpertOutOfRange {
                                location: at(),
                                expert: e as u64,
                                experts: x,
                            });
                        }
                    }
                    if live[..i].contains(&e) {
                        return Err(TraceError::DuplicateExpert {
                            location: at(),
                            expert: e as u32,
                        });
                    }
                    out.push(e as u32);
                    self.max_id = self.max_id.max(Some(e as u32));
                }
                self.max_width = self.max_width.max(live.len());
            }
        }
        Ok(step)
    }

    fn finish(mut self, name: String) -> Result<(Trace, ReadReport), TraceError> {
        let path = self.path;
        let Some(max_id) = self.max_id else {
            return Err(TraceError::Empty(format!(
                "{path}: no routed expert in {} requests",
                self.requests
            )));
        };
        let layers = self.layers.unwrap_or(0);
        let too_large =
            |what: &str| TraceError::TooLarge(format!("{path}: {what} leave no room for a count"));
        let shape = TraceShape {
            layers: u32::try_from(layers).map_err(|_| too_large("the layers"))?,
            experts_per_layer: match self.opts.experts_per_layer {
                Some(e) => e,
                None => max_id.checked_add(1).ok_or_else(|| too_large("the ids"))?,
            },
            top_k: match self.opts.top_k {
                Some(k) => k,
                None => self.max_width.max(1) as u32,
            },
        };
        shape.validate()?;
        self.report.rows.rows = self.report.rows.rows.min(MAX_PICKS);
        self.report.notes.push(format!(
            "{} requests, one after another (batch 1): each prompt one prefill step, each later \
             token one decode step",
            self.requests
        ));
        if self.unknown_prompt > 0 {
            self.report.notes.push(format!(
                "{} requests give no prompt length (meta_info.prompt_tokens, usage.prompt_tokens, \
                 prompt_token_ids) or one longer than their rows: every token of theirs is a step",
                self.unknown_prompt
            ));
        }
        Ok((
            Trace {
                name,
                shape,
                steps: self.steps,
                shifts: Vec::new(),
            },
            self.report,
        ))
    }
}

fn to_i64<T: Into<i64>>(v: std::io::Result<Vec<T>>) -> std::io::Result<Vec<i64>> {
    v.map(|v| v.into_iter().map(Into::into).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(s: &str, opts: &ReadOptions) -> Result<(Trace, ReadReport), TraceError> {
        read_capture_from(s.as_bytes(), "c.json", opts, "c".into())
    }

    #[test]
    fn nested_list_with_prompt_length_is_a_prefill_then_decode() {
        // 3 tokens, 2 layers, top-2; prompt of 2 tokens; layer 0 of token 2 is padding.
        let s = r#"{"usage": {"prompt_tokens": 2}, "choices": [{"routed_experts":
            [[[1, 2], [3, 4]], [[5, 6], [0, 1]], [[-1, -1], [2, 7]]]}]}"#;
        let (t, r) = read(s, &ReadOptions::default()).unwrap();
        assert_eq!(t.steps.len(), 2);
        assert_eq!(t.steps[0].layers, vec![vec![1, 2, 5, 6], vec![3, 4, 0, 1]]);
        assert_eq!(t.steps[1].layers, vec![vec![], vec![2, 7]]);
        assert_eq!(r.padding_rows, 1);
        assert_eq!(t.shape.experts_per_layer, 8);
    }

    #[test]
    fn a_completion_only_body_holds_no_prompt_row() {
        // vLLM's split form without the prompt's part: 2 rows for 2 completion tokens.
        let s = r#"{"usage": {"prompt_tokens": 5, "completion_tokens": 2},
            "choices": [{"routed_experts": [[[1, 2]], [[3, 4]]]}]}"#;
        let (t, _) = read(s, &ReadOptions::default()).unwrap();
        assert_eq!(t.steps.len(), 2);
        assert_eq!(t.steps[1].layers, vec![vec![3, 4]]);
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        for (s, want) in [
            (r#"{"routed_experts": "!!"}"#, "base64"),
            (r#"{"routed_experts": "AAAAAA=="}"#, "--layers"),
            (r#"{"routed_experts": [1, 2]}"#, "shape"),
            (r#"{"routed_experts": [[[1, 1.5]]]}"#, "expert id"),
            (r#"{"other": 1}"#, "no routed experts"),
        ] {
            let e = read(s, &ReadOptions::default()).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
        }
        let e = read(r#"[[[1, 1]], [[2, 2]]]"#, &ReadOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::Empty(_)), "all padding: {e}");
    }
}
