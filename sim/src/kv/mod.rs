//! The KV lab: arrival traces ([`trace`]), the calibrated top-k selection generator
//! ([`selection`]), the decode scheduler shared with the GPU serving benchmark ([`schedule`]) and
//! the serving simulation ([`serving`]) comparing fully resident, fixed hot cache, elastic and the
//! engines' elastic designs (vLLM's hybrid residency, SGLang's demotion) on an arrival trace, the
//! residency policies those pool placements run ([`residency`], shared with the GPU benchmark),
//! with an up-front estimate of its host memory ([`footprint`]).

mod config;
pub mod footprint;
pub mod residency;
pub mod schedule;
pub mod selection;
pub mod serving;
mod time_model;
pub mod trace;
