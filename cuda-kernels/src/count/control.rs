//! The counting controls: [`CountControl`], the device control block's layout, and the
//! [`PickCounterGpu`] setters and pointers.
//!
//! Sources: vLLM's EPLB expert-load recorder (`eplb_map_to_physical_and_record` under
//! `vllm/model_executor/layers/fused_moe/`: a fused record gated by a device-side flag, over the
//! unpadded tokens only) and TensorRT-LLM's MoE load balancer (its statistics exclude warm-up
//! iterations, `EXPERT_STATISTIC_ITER_RANGE`).

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use super::PickCounterGpu;
use crate::error::{drv, Result};

/// u32 words of the device control block ([`PickCounterGpu::control_ptr`]): 16 bytes.
pub const COUNT_CONTROL_WORDS: usize = 4;
/// Word index of the enable flag in the control block (`TIERKIT_CTL_ENABLED` in the header).
pub const COUNT_CONTROL_ENABLED: usize = 0;
/// Word index of the valid-token count in the control block (`TIERKIT_CTL_VALID_TOKENS`).
pub const COUNT_CONTROL_VALID_TOKENS: usize = 1;

/// What the counting kernels count, as held in a counter's device control block.
///
/// Block layout (u32 `[4]`, one allocation at a fixed address, so captured graphs keep it):
/// word 0 `enabled` (0: nothing is counted; any other value: counting), word 1 `valid_tokens`
/// (token rows `t >= valid_tokens` are padding or dummy rows, skipped in every layer of every
/// launch; `u32::MAX`, the default, counts every row), words 2 and 3 reserved (0).
/// `valid_tokens` is one count for the whole step, not per layer: a padded batch has the same
/// real rows in every layer. A skipped pick is neither counted nor rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CountControl {
    /// Whether anything is counted (false for warm-up, profiling and draft passes).
    pub enabled: bool,
    /// Token rows below this count are counted; rows at or above it are skipped.
    pub valid_tokens: u32,
}

impl CountControl {
    /// Every pick counted: enabled, `valid_tokens = u32::MAX`. The state of a new counter.
    pub const ALL: CountControl = CountControl {
        enabled: true,
        valid_tokens: u32::MAX,
    };

    /// The block's words, as the kernels read them (`[enabled, valid_tokens, 0, 0]`).
    pub fn to_words(self) -> [u32; COUNT_CONTROL_WORDS] {
        [self.enabled as u32, self.valid_tokens, 0, 0]
    }

    /// Whether a pick of token row `token` is counted.
    pub fn counts_token(self, token: u32) -> bool {
        self.enabled && token < self.valid_tokens
    }
}

impl Default for CountControl {
    fn default() -> Self {
        CountControl::ALL
    }
}

impl PickCounterGpu {
    /// Device pointer of the control block, u32 `[4]` (layout at [`CountControl`]): pass it as
    /// `ctl` to `tierkit_count_pick_striped_ctl` / `tierkit_count_token_counted` in the fused
    /// header, or write it from the engine (e.g. a torch `copy_` of an `int32 [2]` tensor into
    /// `[enabled, valid_tokens]`, ordered on the step stream). Fixed for the counter's life.
    pub fn control_ptr(&self) -> u64 {
        self.control.device_ptr()
    }

    /// Device pointer of the enable flag (u32, word 0 of the control block).
    pub fn enabled_ptr(&self) -> u64 {
        self.control_ptr() + 4 * COUNT_CONTROL_ENABLED as u64
    }

    /// Device pointer of the valid-token count (u32, word 1 of the control block).
    pub fn valid_tokens_ptr(&self) -> u64 {
        self.control_ptr() + 4 * COUNT_CONTROL_VALID_TOKENS as u64
    }

    /// Writes the enable flag on `stream` (one tiny launch, stream-ordered): counts queued on
    /// `stream` (or forked from it) after this call see it, earlier ones do not. Launched inside
    /// a capture the value is baked into the graph; to change it between replays, call it on the
    /// stream outside the capture, before `launch`.
    ///
    /// # Errors
    /// CUDA launch errors.
    pub fn set_enabled_async(&self, stream: &CudaStream, enabled: bool) -> Result<()> {
        self.set_word(stream, COUNT_CONTROL_ENABLED, enabled as u32)
    }

    /// Writes the valid-token count on `stream` (as [`PickCounterGpu::set_enabled_async`]):
    /// token rows `>= valid_tokens` of later counts are skipped; `u32::MAX` counts every row.
    ///
    /// # Errors
    /// CUDA launch errors.
    pub fn set_valid_tokens_async(&self, stream: &CudaStream, valid_tokens: u32) -> Result<()> {
        self.set_word(stream, COUNT_CONTROL_VALID_TOKENS, valid_tokens)
    }

    /// Writes both controls on `stream` (two tiny launches; see
    /// [`PickCounterGpu::set_enabled_async`]).
    ///
    /// # Errors
    /// CUDA launch errors (the first failure; the enable flag is written first).
    pub fn set_control_async(&self, stream: &CudaStream, control: CountControl) -> Result<()> {
        self.set_enabled_async(stream, control.enabled)?;
        self.set_valid_tokens_async(stream, control.valid_tokens)
    }

    fn set_word(&self, stream: &CudaStream, word: usize, value: u32) -> Result<()> {
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ctl, word) = (self.control_ptr(), word as u32);
        let mut b = stream.launch_builder(&self.f_set_control);
        b.arg(&ctl).arg(&word).arg(&value);
        // SAFETY: argument list matches `tierkit_count_set_control` (ptr, u32, u32); the kernel
        // writes ctl[word] only for word < 4, inside the control block's 4-word allocation,
        // which lives as long as `self`.
        unsafe { b.launch(cfg) }.map_err(drv("cuLaunchKernel(tierkit_count_set_control)"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_words_and_defaults() {
        assert_eq!(CountControl::default(), CountControl::ALL);
        assert_eq!(CountControl::ALL.to_words(), [1, u32::MAX, 0, 0]);
        let c = CountControl {
            enabled: true,
            valid_tokens: 3,
        };
        assert!(c.counts_token(2) && !c.counts_token(3));
        let off = CountControl {
            enabled: false,
            ..CountControl::ALL
        };
        assert!(!off.counts_token(0));
        assert_eq!(off.to_words()[0], 0);
    }
}
