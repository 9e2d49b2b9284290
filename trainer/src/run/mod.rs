//! A complete training run of one of the built-in models (MLP, CNN or GPT), as the `localsgd`
//! binary does it: data, model, algorithm, pipeline, checkpoints, metrics and evaluation, on
//! every rank.
//!
//! | file | what it holds |
//! |---|---|
//! | `setup.rs` | data, the model checks before anything is written, the model, optimizer, schedule and pipeline of a configuration |
//! | `device.rs` | the device a rank computes on |
//! | `loader.rs` | [`ShardLoader`], a rank's shard of the training data |
//! | `worker.rs` | [`train_worker`]: one world's training of one rank, the one loop ([`Pipeline::run_epoch`](localsgd_pipeline::pipeline::Pipeline::run_epoch) per epoch) |
//! | `observer.rs` | what watches that loop between iterations: metrics, evaluations, progress, checkpoint publishing, rehearsed faults |
//! | `inject.rs` | what a rehearsed fault ([`crate::fault`]) does |
//! | `evaluation.rs` | test-set evaluation and the final models' files |
//! | `recovery.rs` | [`run_rank`] and [`train_threads`]: the per-rank run, a failed rank's shrink, replacement and hand-over |
//!
//! `run_rank` is the whole per-rank run for any `Group` (`train_worker`, then totals gathered
//! once by `RunTotals::gather`). With `on-rank-failure = "continue"`, it catches a peer's
//! failure, shrinks the group and starts `train_worker`'s body again on the survivors from the
//! last published checkpoint, each from its own saved file (`Start::ResumeFrom`): a failure is
//! handled as a resume on another number of ranks, the one code path `resume-ranks` also takes
//! (book: Fault tolerance). `RankState` carries what spans worlds (faults left, membership
//! changes, samples, traffic, the loss curve). With `"replace"` the survivors then `grow` the
//! group back and the lowest live rank hands each new rank (which starts in `receive_handover`)
//! a `Handover` and the failed rank's file of that checkpoint over `broadcast_bytes`; the new
//! rank resumes from those bytes (`Start::Received`, `Checkpoints::resume_received`) and
//! everyone continues at full size. `compute_device` / `device_on_host`: the device a rank
//! computes on (`device`: burn's `flex`, its CUDA backend, or its LibTorch backend on the CPU or
//! a GPU with LibTorch's intra-op threads shared out among the host's ranks).

mod device;
mod error;
mod evaluation;
mod inject;
mod loader;
mod observer;
mod recovery;
mod result;
mod setup;
mod state;
mod worker;

pub use device::{compute_device, device_on_host};
pub use error::RunError;
pub use evaluation::{Evaluation, MODEL_FILE, accuracy, evaluate};
pub use recovery::{RankOutcome, run_rank, train_threads};
pub use result::{RunTotals, WorkerResult};
pub use setup::{load_data, lr_schedule, model_config, optimizer, preflight, run_identity};
pub use state::Progress;
