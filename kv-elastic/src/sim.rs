//! Serving simulation (in progress).
