//! A parameter's, gradient's or optimizer state's f32 values as one writable slice, for the fused
//! loops, and the tensor they become again.
//!
//! On burn's CPU backend the values are the tensor's own buffer ([`Tensor::into_data`] hands it
//! over without a copy where burn holds the only reference). With the feature `libtorch`, a
//! tensor on LibTorch's CPU device is stepped in its own storage too: the loop writes through
//! LibTorch's data pointer where burn's LibTorch backend would itself update the tensor in place
//! (it alone references the storage, which is contiguous); otherwise it steps a copy.

use burn::tensor::{Device, Tensor, TensorData};

/// f32 values that a fused loop reads or updates in place.
pub(super) enum Buffer {
    /// The values of a tensor of burn's CPU backend (or bytes from elsewhere), and its device.
    Host(TensorData, Device),
    /// A tensor of LibTorch's CPU device, contiguous f32.
    #[cfg(feature = "libtorch")]
    Torch(torch::Owned),
}

impl Buffer {
    /// The values of `tensor`, which [`super::host`] accepted.
    #[allow(deprecated)] // `Device::libtorch`: see `torch` below.
    pub(super) fn take<const D: usize>(tensor: Tensor<D>) -> Self {
        #[cfg(feature = "libtorch")]
        if tensor.device() == Device::libtorch() {
            return Buffer::Torch(torch::Owned::take(tensor));
        }
        let device = tensor.device();
        Buffer::Host(tensor.into_data(), device)
    }

    /// A new buffer of the same shape and device holding zeros.
    pub(super) fn zeros_like(&self) -> Self {
        match self {
            Buffer::Host(data, device) => Buffer::Host(
                TensorData::zeros::<f32, _>(data.shape().clone()),
                device.clone(),
            ),
            #[cfg(feature = "libtorch")]
            Buffer::Torch(t) => Buffer::Torch(t.zeros_like()),
        }
    }

    /// A new buffer holding a copy of these values.
    pub(super) fn copy(&self) -> Self {
        match self {
            Buffer::Host(data, device) => Buffer::Host(data.clone(), device.clone()),
            #[cfg(feature = "libtorch")]
            Buffer::Torch(t) => Buffer::Torch(t.copy()),
        }
    }

    /// The values, if they are f32.
    pub(super) fn values(&self) -> Option<&[f32]> {
        match self {
            Buffer::Host(data, _) => data.as_slice::<f32>().ok(),
            #[cfg(feature = "libtorch")]
            Buffer::Torch(t) => Some(t.values()),
        }
    }

    /// The values to update in place, if they are f32 (on LibTorch, first made this buffer's
    /// own: a copy where its storage is shared).
    pub(super) fn values_mut(&mut self) -> Option<&mut [f32]> {
        match self {
            Buffer::Host(data, _) => data.as_mut_slice::<f32>().ok(),
            #[cfg(feature = "libtorch")]
            Buffer::Torch(t) => Some(t.values_mut()),
        }
    }

    /// The tensor of these values.
    pub(super) fn into_tensor<const D: usize>(self) -> Tensor<D> {
        match self {
            Buffer::Host(data, device) => Tensor::from_data(data, &device),
            #[cfg(feature = "libtorch")]
            Buffer::Torch(t) => t.into_tensor(),
        }
    }
}

#[cfg(feature = "libtorch")]
pub(super) mod torch {
    // burn marks its LibTorch backend deprecated (in favour of its CubeCL backends); the
    // binary's `device = "libtorch"` uses it on purpose.
    #![allow(deprecated)]

    use burn::backend::LibTorch;
    use burn::backend::libtorch::TchTensor;
    use burn::tensor::Tensor;

    /// A LibTorch tensor whose f32 values are read, and written only once this value owns them.
    pub(in crate::optim) struct Owned {
        tensor: TchTensor,
    }

    impl Owned {
        /// The LibTorch primitive of `tensor`, a float tensor on LibTorch's CPU device; made
        /// contiguous f32 (a copy where it was not).
        pub(super) fn take<const D: usize>(tensor: Tensor<D>) -> Self {
            let primitive = match tensor.try_into_primitive::<LibTorch>() {
                Ok(primitive) => primitive,
                // `host` accepted only f32 tensors on LibTorch's device, whose primitive is a
                // LibTorch float tensor.
                Err(e) => panic!("a float tensor on LibTorch's device is not LibTorch's: {e:?}"),
            };
            let t = &primitive.tensor;
            if t.is_contiguous() && t.kind() == tch::Kind::Float && t.device() == tch::Device::Cpu {
                Owned { tensor: primitive }
            } else {
                let copy = t
                    .to_device(tch::Device::Cpu)
                    .to_kind(tch::Kind::Float)
                    .contiguous()
                    .copy();
                Owned {
                    tensor: TchTensor::new(copy),
                }
            }
        }

        pub(super) fn zeros_like(&self) -> Self {
            Owned {
                tensor: TchTensor::new(self.tensor.tensor.zeros_like()),
            }
        }

        pub(super) fn copy(&self) -> Self {
            Owned {
                tensor: TchTensor::new(self.tensor.tensor.copy()),
            }
        }

        pub(super) fn values(&self) -> &[f32] {
            let t = &self.tensor.tensor;
            let n = t.numel();
            if n == 0 {
                return &[];
            }
            // SAFETY: `take` and the constructors above keep the tensor contiguous f32 on the
            // CPU, so its data pointer addresses `n` initialised f32 values, valid while
            // `self.tensor` lives; nothing writes them while this borrow of `self` lasts.
            unsafe { std::slice::from_raw_parts(t.data_ptr() as *const f32, n) }
        }

        pub(super) fn values_mut(&mut self) -> &mut [f32] {
            if !self.tensor.can_mut() {
                // Another tensor shares the storage: step a copy, as burn's own ops would.
                self.tensor = TchTensor::new(self.tensor.tensor.copy());
            }
            let t = &self.tensor.tensor;
            let n = t.numel();
            if n == 0 {
                return &mut [];
            }
            // SAFETY: contiguous f32 on the CPU (as in `values`), and `can_mut` says no other
            // tensor (burn's storage references) shares the storage, so this exclusive borrow of
            // `self` is the only access to the `n` values.
            unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut f32, n) }
        }

        pub(super) fn into_tensor<const D: usize>(self) -> Tensor<D> {
            Tensor::from_primitive::<LibTorch>(self.tensor)
        }
    }
}
