//! A user's own loop survives a failed rank with `Recovery::run`: under `Replace` the job ends
//! bit-identical on every rank to the same job without the failure (the replacement takes the
//! failed rank's file of the last checkpoint from a live rank); under `Continue` the survivors
//! finish the run on the smaller world from that checkpoint, and the change is recorded.

use burn::module::{Module, Param};
use burn::optim::SgdConfig;
use burn::tensor::{Device, Tensor, TensorData};
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_comm::{Group, ThreadWorld};
use localsgd_pipeline::algorithm::{AlgorithmSpec, build};
use localsgd_pipeline::checkpoint::{Checkpoints, Publish, RunIdentity};
use localsgd_pipeline::pipeline::is_peer_lost;
use localsgd_pipeline::pipeline::{
    BatchSource, DataPosition, EpochEnd, IterationReport, LossFn, ObserverError, Pipeline,
    PipelineOptions, SourceError,
};
use localsgd_pipeline::recovery::{MEMBERSHIP_FILE, OnRankFailure, Recovery, Start};
use std::path::Path;
use std::time::Duration;

#[derive(Module, Debug)]
struct Linear1 {
    w: Param<Tensor<2>>,
    b: Param<Tensor<1>>,
}

type Batch = (Tensor<2>, Tensor<2>);

fn device() -> Device {
    Device::flex().autodiff()
}

fn model() -> Linear1 {
    let w = Tensor::from_data(TensorData::new(vec![0.5f32, -0.25], [2, 1]), &device());
    let b = Tensor::from_data(TensorData::new(vec![0.1f32], [1]), &device());
    Linear1 {
        w: Param::from_tensor(w),
        b: Param::from_tensor(b),
    }
}

fn loss(m: &Linear1, (x, y): &Batch) -> Tensor<1> {
    let d = x.clone().matmul(m.w.val()) + m.b.val().unsqueeze::<2>() - y.clone();
    (d.clone() * d).mean()
}

/// Batch `i` of world rank `rank`, and where the source stands (so a resume continues with the
/// same batch).
struct Numbered {
    rank: usize,
    next: u64,
}

impl BatchSource<Batch> for Numbered {
    fn next_batch(&mut self) -> Result<Option<Batch>, SourceError> {
        let i = self.next as usize;
        self.next += 1;
        let v = |k: usize| ((self.rank * 31 + i * 7 + k) % 11) as f32 / 5.0 - 1.0;
        let x = Tensor::from_data(
            TensorData::new(vec![v(0), v(1), v(2), v(3)], [2, 2]),
            &device(),
        );
        let y = Tensor::from_data(TensorData::new(vec![v(4), v(5)], [2, 1]), &device());
        Ok(Some((x, y)))
    }

    fn position(&self) -> Option<DataPosition> {
        Some(DataPosition {
            epoch: 0,
            next_batch: self.next,
            start: 0,
        })
    }
}

fn params(m: &Linear1) -> Vec<f32> {
    match flatten_params(m, &ParamSelection::All).unwrap().buffer {
        FlatBuffer::F32(v) => v,
        FlatBuffer::F64(v) => v.into_iter().map(|x| x as f32).collect(),
    }
}

const ITERATIONS: u64 = 10;
const CHECKPOINT_EVERY: u64 = 4;

/// What a job fails with: the pipeline's, the checkpoints' or the recovery's errors, boxed.
type Error = Box<dyn std::error::Error + Send + Sync>;

/// Where a rank of the first world dies: `(rank, iteration, inside the checkpoint)`: after
/// completing that iteration, or inside the checkpoint phase of that many iterations, before
/// it saves anything (its peers wait in the checkpoint's first barrier).
type Death = Option<(usize, u64, bool)>;

/// One rank's job: `iterations` iterations in all of `spec` on `group`, checkpointed in `dir`,
/// doing `policy` when a peer fails, starting where `first` says; the rank of the first world
/// `dies` names panics where it says (a replacement never does). Returns the
/// final parameters and world size.
fn job(
    group: Group,
    dir: &Path,
    spec: &AlgorithmSpec,
    policy: OnRankFailure,
    dies: Death,
    first: Start,
    iterations: u64,
) -> Result<(Vec<f32>, usize), Error> {
    let first_world = !group.joined();
    let (mut recovery, start) = if group.joined() {
        let (recovery, joined) = Recovery::join(policy, Some(dir), spec.clone(), &group)?;
        (recovery, joined.start)
    } else {
        let rank = group.rank();
        let recovery = Recovery::new(policy, Some(dir), spec.clone(), group.size(), rank);
        (recovery, first)
    };
    let is_lost = |e: &Error| is_peer_lost(&**e);
    let (result, _) = recovery.run(group, start, is_lost, |group, start, recovery| {
        let (rank, world) = (group.rank(), group.size());
        let job_rank = group.world_ranks()[rank];
        let spec = spec.for_world(world);
        let identity = RunIdentity::from_spec(&spec, world).with_members(group.world_ranks());
        let checkpoints = Checkpoints::new(dir, identity);
        let options = PipelineOptions {
            lr: 0.1,
            checkpoint_every: CHECKPOINT_EVERY,
            ..PipelineOptions::default()
        };
        let mut pipeline = Pipeline::new(group.clone(), SgdConfig::new().init(), options)
            .with_parts(build(&spec, group)?)
            .with_checkpointer({
                let mut save = checkpoints.checkpointer(Publish::Now);
                Box::new(move |ctx| {
                    if first_world && dies == Some((job_rank, ctx.iterations_done, true)) {
                        panic!(
                            "rank {job_rank} dies inside checkpoint {}",
                            ctx.iterations_done
                        );
                    }
                    save(ctx)
                })
            });
        let (model, next, resumed) = match &start {
            Start::Fresh => (model(), 0, None),
            start => {
                let r = start.resume(&checkpoints, &spec, model(), &mut pipeline)?;
                let next = r.data.map_or(0, |d| d.next_batch);
                (r.model, next, Some(r.iterations_done))
            }
        };
        recovery.started(&start, rank, resumed);
        let mut observer = |r: &IterationReport, _: &Linear1| -> Result<bool, ObserverError> {
            let done = r.iteration + 1;
            if first_world && dies == Some((job_rank, done, false)) {
                panic!("rank {job_rank} dies after iteration {done}");
            }
            recovery.completed(done)?;
            // `Publish::Now`: the checkpoint phase published it, every rank holding its file.
            if done.is_multiple_of(CHECKPOINT_EVERY) {
                recovery.remember_checkpoint(done, rank);
            }
            Ok(true)
        };
        let mut source = Numbered { rank, next };
        let (model, end) = pipeline.run_epoch(
            model,
            &mut source,
            &mut LossFn(&loss),
            &mut observer,
            Some(iterations),
        )?;
        assert_eq!(end, EpochEnd::Budget);
        let model = pipeline.finish(model)?;
        Ok((params(&model), world))
    })?;
    Ok(result)
}

/// Every rank's final parameters and world size (replacements after the first world's ranks),
/// the failed rank left out.
fn run(
    spec: &AlgorithmSpec,
    policy: OnRankFailure,
    dies: Death,
) -> (Vec<(Vec<f32>, usize)>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let finished = run_in(
        dir.path(),
        3,
        spec,
        policy,
        dies,
        |_| Start::Fresh,
        ITERATIONS,
    );
    (finished, dir)
}

/// [`run`] on `world` ranks in `dir`, each starting where `first` says, for `iterations`.
fn run_in(
    dir: &Path,
    world: usize,
    spec: &AlgorithmSpec,
    policy: OnRankFailure,
    dies: Death,
    first: impl Fn(usize) -> Start + Sync,
    iterations: u64,
) -> Vec<(Vec<f32>, usize)> {
    let outcomes = ThreadWorld::new(world)
        .unwrap()
        .with_timeout(Duration::from_secs(20))
        .run_each(|group| {
            let start = first(group.rank());
            job(group, dir, spec, policy, dies, start, iterations).map_err(|e| e.to_string())
        });
    outcomes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| dies.is_none_or(|(r, _, _)| *i != r))
        .map(|(i, o)| match o {
            Ok(Ok(r)) => r,
            other => panic!("rank {i}: {other:?}"),
        })
        .collect()
}

/// Every algorithm, rank 1 dying after iteration 6 (the world goes back to the checkpoint of
/// 4); rank 0, the one that writes `latest` and `membership.csv`; a rank dying inside a
/// checkpoint.
#[test]
fn a_replaced_rank_ends_the_job_bit_identical_to_the_job_without_the_failure() {
    let cases = [
        (AlgorithmSpec::default(), 1, 6u64),
        (AlgorithmSpec::post_local_sgd(2, 2), 1, 6),
        (AlgorithmSpec::post_local_sgd(2, 2), 0, 6),
        (AlgorithmSpec::diloco(2), 1, 6),
        (AlgorithmSpec::streaming_diloco(2, 2), 1, 6),
        (AlgorithmSpec::slowmo(2, 4), 1, 6),
        // Inside the checkpoint of 8 (rank 0 dying after it began it): the world goes back
        // to 4 all the same, and writes 8 again.
        (AlgorithmSpec::diloco(2), 2, 8),
        (AlgorithmSpec::post_local_sgd(2, 2), 0, 8),
    ];
    for (spec, dying, at) in cases {
        let (reference, _) = run(&spec, OnRankFailure::Replace, None);
        let inside = at.is_multiple_of(CHECKPOINT_EVERY);
        let (replaced, dir) = run(&spec, OnRankFailure::Replace, Some((dying, at, inside)));
        // The first world's live ranks, then the replacement of the rank that died.
        let order = (0..3).filter(|&r| r != dying).chain([dying]);
        assert_eq!(replaced.len(), 3, "{spec:?}");
        for (got, r) in replaced.iter().zip(order) {
            assert_eq!(got, &reference[r], "{spec:?}, rank {r} (rank {dying} died)");
        }
        let record = std::fs::read_to_string(dir.path().join(MEMBERSHIP_FILE)).unwrap();
        let row: Vec<&str> = record.lines().nth(1).unwrap().split(',').collect();
        // iteration, detected_at, left, joined, world_size, members
        // Inside the checkpoint phase of 8, iteration 8 has not completed.
        let detected = if inside { at - 1 } else { at }.to_string();
        let dying = dying.to_string();
        let want = ["4", &detected, &dying, &dying, "3", "0 1 2"];
        assert_eq!(&row[..6], want, "{spec:?}: {record}");
    }
}

/// The survivors of rank 2's failure after iteration 5 go back to the checkpoint of 4 and end
/// as a job does that resumes that checkpoint on two ranks, each from its own file.
#[test]
fn the_survivors_continue_as_a_resume_on_the_smaller_world() {
    let spec = AlgorithmSpec::post_local_sgd(2, 2);
    let (survivors, dir) = run(&spec, OnRankFailure::Continue, Some((2, 5, false)));
    let record = std::fs::read_to_string(dir.path().join(MEMBERSHIP_FILE)).unwrap();
    let row: Vec<&str> = record.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(&row[..6], ["4", "5", "2", "", "2", "0 1"], "{record}");

    let reference = tempfile::tempdir().unwrap();
    let (abort, fresh) = (OnRankFailure::Abort, |_| Start::Fresh);
    run_in(
        reference.path(),
        3,
        &spec,
        abort,
        None,
        fresh,
        CHECKPOINT_EVERY,
    );
    let resumed = run_in(
        reference.path(),
        2,
        &spec,
        abort,
        None,
        Start::ResumeFrom,
        ITERATIONS,
    );
    assert_eq!(survivors.len(), 2);
    assert_eq!(survivors, resumed);
}

/// A group that says it is NCCL's, for what happens before any collective.
#[derive(Debug)]
struct NcclLike;

impl localsgd_comm::ProcessGroup for NcclLike {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        2
    }
    fn world_ranks(&self) -> &[usize] {
        &[0, 1]
    }
    fn backend(&self) -> &'static str {
        "nccl"
    }
    fn all_reduce(
        &self,
        _: localsgd_comm::buffer::BufferMut<'_>,
        _: localsgd_comm::ReduceOp,
    ) -> Result<(), localsgd_comm::CommError> {
        unreachable!("no collective runs")
    }
    fn broadcast(
        &self,
        _: localsgd_comm::buffer::BufferMut<'_>,
        _: usize,
    ) -> Result<(), localsgd_comm::CommError> {
        unreachable!("no collective runs")
    }
    fn barrier(&self) -> Result<(), localsgd_comm::CommError> {
        unreachable!("no collective runs")
    }
    fn all_gather_u64(&self, _: &[u64]) -> Result<Vec<u64>, localsgd_comm::CommError> {
        unreachable!("no collective runs")
    }
    fn all_gather_bytes(&self, _: &[u8], _: &mut [u8]) -> Result<(), localsgd_comm::CommError> {
        unreachable!("no collective runs")
    }
    fn split(&self, _: u64) -> Result<Group, localsgd_comm::CommError> {
        unreachable!("no collective runs")
    }
    fn dedicated(&self) -> Result<Group, localsgd_comm::CommError> {
        unreachable!("no collective runs")
    }
    fn charge(&self, _: &localsgd_comm::CallSignature) {}
    fn host_id(&self) -> u64 {
        0
    }
    fn traffic(&self) -> localsgd_comm::Traffic {
        localsgd_comm::Traffic::default()
    }
}

/// NCCL groups cannot shrink: a policy that survives is refused before anything trains, naming
/// the setting and what would work; `Abort` trains.
#[test]
fn surviving_on_an_nccl_group_is_refused_before_training() {
    let group: Group = std::sync::Arc::new(NcclLike);
    let spec = AlgorithmSpec::post_local_sgd(2, 2);
    for policy in [OnRankFailure::Continue, OnRankFailure::Replace] {
        let mut recovery = Recovery::new(policy, None, spec.clone(), 2, 0);
        let mut trained = false;
        let out = recovery.run(
            group.clone(),
            Start::Fresh,
            |e: &Error| is_peer_lost(&**e),
            |_, _, _| -> Result<(), Error> {
                trained = true;
                Ok(())
            },
        );
        let message = out.expect_err("refused").to_string();
        assert!(!trained);
        assert!(
            message.starts_with("invalid setting `on-rank-failure`")
                && message.contains("MPI with ULFM"),
            "{message}"
        );
    }
    let mut recovery = Recovery::new(OnRankFailure::Abort, None, spec, 2, 0);
    let out = recovery.run(group, Start::Fresh, |_: &Error| false, |_, _, _| Ok(7));
    assert_eq!(out.map(|(v, _)| v).ok(), Some(7));
}
