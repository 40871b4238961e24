//! The KV lab: arrival traces ([`trace`]), the calibrated top-k selection generator
//! ([`selection`]), the decode scheduler shared with the GPU serving benchmark ([`schedule`]) and
//! the serving simulation ([`serving`]) comparing fully resident, fixed hot
//! cache and elastic placements on an arrival trace, with an up-front estimate of its host memory
//! ([`footprint`]).

pub mod footprint;
pub mod schedule;
pub mod selection;
pub mod serving;
pub mod trace;
