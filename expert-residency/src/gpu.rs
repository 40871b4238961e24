//! GPU swap executor (owned by the cuda-kernels work; placeholder until it lands).
