//! [`CompressHook`]: run any hook on a half-precision copy of the bucket.

use crate::bucket::GradBucket;
use crate::error::HookError;
use crate::hook::{CommHook, HookState};
pub use localsgd_comm::Precision;

/// Wraps a hook: cast the bucket to half precision, run the inner hook on it (so its collectives
/// move half the bytes), cast the result back to the bucket's original type.
///
/// Like PyTorch's wrappers, the round trip rounds the gradients to half precision even when the
/// inner hook does not communicate, so [`skips_communication`](CommHook::skips_communication)
/// is always false.
#[derive(Debug)]
pub struct CompressHook<H: CommHook = Box<dyn CommHook>> {
    precision: Precision,
    inner: H,
}

impl<H: CommHook> CompressHook<H> {
    /// Wrap `inner` with the given wire precision.
    pub fn new(precision: Precision, inner: H) -> Self {
        Self { precision, inner }
    }

    /// fp16 compression around `inner`.
    pub fn fp16(inner: H) -> Self {
        Self::new(Precision::Fp16, inner)
    }

    /// bf16 compression around `inner`.
    pub fn bf16(inner: H) -> Self {
        Self::new(Precision::Bf16, inner)
    }

    /// The wire precision.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The wrapped hook.
    pub fn inner(&self) -> &H {
        &self.inner
    }
}

impl<H: CommHook> CommHook for CompressHook<H> {
    fn run(&mut self, bucket: &mut GradBucket) -> Result<(), HookError> {
        let original = bucket.element_type();
        let compressed = bucket.data().cast(self.precision.element_type())?;
        bucket.replace_data(compressed);
        self.inner.run(bucket)?;
        let restored = bucket.data().cast(original)?;
        bucket.replace_data(restored);
        Ok(())
    }

    fn state(&self) -> HookState {
        HookState::Compressed {
            precision: self.precision,
            inner: Box::new(self.inner.state()),
        }
    }

    fn load_state(&mut self, state: &HookState) -> Result<(), HookError> {
        match state {
            HookState::Compressed { precision, inner } if *precision == self.precision => {
                self.inner.load_state(inner)
            }
            other => Err(self.state().kind_mismatch(other)),
        }
    }
}
