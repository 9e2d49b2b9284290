//! The device a rank computes on.

use super::error::RunError;
use crate::config::DeviceKind;
use burn::tensor::Device;
use localsgd_comm::Group;

/// The autodiff device a rank computes on: burn's `flex` CPU backend; (trainer feature `cuda`)
/// the GPU whose index is the rank's position among the ranks on its host (one GPU per rank);
/// (trainer feature `libtorch`) LibTorch on the CPU, or on that GPU. Collective for the GPU and
/// LibTorch kinds (they split the world by host).
pub fn compute_device(kind: DeviceKind, group: &Group) -> Result<Device, RunError> {
    match kind {
        DeviceKind::Cpu => Ok(Device::flex().autodiff()),
        DeviceKind::Cuda | DeviceKind::Libtorch | DeviceKind::LibtorchCuda => {
            let node = group.intra_node()?;
            device_on_host(kind, node.rank(), node.size())
        }
    }
}

/// [`compute_device`] for the rank at `local_rank` of the `local_ranks` that compute on this host.
/// LibTorch's intra-op threads: the host's cores shared out among them, unless
/// `OMP_NUM_THREADS` is set (PyTorch's own rule); burn's `flex` threads are set by the caller
/// (rayon's pool).
pub fn device_on_host(
    kind: DeviceKind,
    local_rank: usize,
    local_ranks: usize,
) -> Result<Device, RunError> {
    match kind {
        DeviceKind::Cpu => Ok(Device::flex().autodiff()),
        DeviceKind::Cuda => cuda_device(local_rank),
        DeviceKind::Libtorch | DeviceKind::LibtorchCuda => {
            libtorch_device(kind == DeviceKind::LibtorchCuda, local_rank, local_ranks)
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_device(local_rank: usize) -> Result<Device, RunError> {
    Ok(Device::cuda(local_rank).autodiff())
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_local_rank: usize) -> Result<Device, RunError> {
    Err(RunError::Device(
        "`cuda` needs a binary built with the trainer feature `cuda`; use `cpu`".into(),
    ))
}

#[cfg(feature = "libtorch")]
// burn marks its LibTorch backend deprecated (for its CubeCL ones); `device = "libtorch"` is the
// choice of PyTorch's own CPU kernels.
#[allow(deprecated)]
fn libtorch_device(gpu: bool, local_rank: usize, local_ranks: usize) -> Result<Device, RunError> {
    if gpu {
        let gpus = tch::Cuda::device_count().max(0) as usize;
        if local_rank >= gpus {
            return Err(RunError::Device(format!(
                "`libtorch-cuda`: rank {local_rank} on this host needs GPU {local_rank}, and \
                 LibTorch sees {gpus} (a CUDA build of PyTorch and one GPU per rank; `libtorch` \
                 computes on the CPU)"
            )));
        }
    }
    if std::env::var_os("OMP_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Per calling thread under OpenMP: every rank of a thread-backend process sets it.
        tch::set_num_threads((cores / local_ranks.max(1)).max(1) as i32);
    }
    Ok(if gpu {
        Device::libtorch_cuda(local_rank).autodiff()
    } else {
        Device::libtorch().autodiff()
    })
}

#[cfg(not(feature = "libtorch"))]
fn libtorch_device(
    _gpu: bool,
    _local_rank: usize,
    _local_ranks: usize,
) -> Result<Device, RunError> {
    Err(RunError::Device(
        "`libtorch` and `libtorch-cuda` need a binary built with the trainer feature `libtorch`; use `cpu`".into(),
    ))
}
