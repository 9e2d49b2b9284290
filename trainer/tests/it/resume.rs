//! Resuming from a checkpoint gives bit-identical parameters to a run that never stopped, and
//! refuses checkpoints from runs with another world size or algorithm.

use localsgd_trainer::config::{AlgorithmKind, DatasetKind, OptimizerKind, TrainConfig};
use localsgd_trainer::run::{RankOutcome, WorkerResult, load_data, train_threads};

fn config(
    dir: &std::path::Path,
    algorithm: AlgorithmKind,
    optimizer: OptimizerKind,
) -> TrainConfig {
    TrainConfig {
        workers: 2,
        algorithm,
        warmup: 3,
        // Hierarchical averaging on its levels, DDP on none, the others every 2 steps.
        period: (!matches!(algorithm, AlgorithmKind::Hierarchical | AlgorithmKind::Ddp))
            .then_some(2),
        levels: match algorithm {
            AlgorithmKind::Hierarchical => "2:1,5:2".parse().unwrap(),
            _ => Default::default(),
        },
        dataset: DatasetKind::Synthetic,
        synthetic_samples: 200,
        synthetic_dim: 6,
        synthetic_classes: 3,
        hidden: vec![8],
        batch_size: 16,
        optimizer,
        lr: 0.05,
        checkpoint_every: 4,
        log_every: 3,
        run_dir: dir.to_path_buf(),
        progress: false,
        ..TrainConfig::default()
    }
}

fn bits(r: &localsgd_trainer::run::WorkerResult) -> Vec<u32> {
    match &r.params {
        localsgd_comm::params::FlatBuffer::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
        other => panic!("unexpected {other:?}"),
    }
}

fn check_resume(algorithm: AlgorithmKind, optimizer: OptimizerKind) {
    check_resume_overlapped(algorithm, optimizer, 0);
}

fn check_resume_overlapped(algorithm: AlgorithmKind, optimizer: OptimizerKind, overlap: u64) {
    check_resume_with(algorithm, optimizer, overlap, |_| {});
}

fn check_resume_with(
    algorithm: AlgorithmKind,
    optimizer: OptimizerKind,
    overlap: u64,
    tweak: fn(&mut TrainConfig),
) {
    let straight_dir = tempfile::tempdir().unwrap();
    let resumed_dir = tempfile::tempdir().unwrap();
    let mut cfg = config(straight_dir.path(), algorithm, optimizer);
    cfg.overlap = overlap;
    tweak(&mut cfg);
    let data = load_data(&cfg).unwrap();
    // 160 training rows / 2 ranks / batch 16 = 5 batches per epoch: 13 steps cross two epoch
    // boundaries, and the stop at 7 is mid-epoch.
    cfg.steps = Some(13);
    let results = |outcomes: Vec<RankOutcome>| -> Vec<WorkerResult> {
        outcomes.into_iter().map(|o| o.result).collect()
    };
    let straight = results(train_threads(&cfg, &data, Some(straight_dir.path()), None).unwrap());

    let mut first = config(resumed_dir.path(), algorithm, optimizer);
    first.overlap = overlap;
    tweak(&mut first);
    first.steps = Some(7);
    train_threads(&first, &data, Some(resumed_dir.path()), None).unwrap();
    if overlap > 0 {
        // The stop must fall inside an overlap window, or this would test blocking resume.
        let spec = first.algorithm_spec().unwrap();
        let identity = localsgd_trainer::run::run_identity(&spec, first.workers);
        let dir = localsgd_pipeline::checkpoint::CheckpointDir::new(resumed_dir.path());
        for rank in 0..first.workers {
            let ckpt = dir.load_rank(rank, &identity).unwrap();
            let pending = ckpt
                .pending_average()
                .expect("a pending average at the stop");
            assert_eq!(pending.started_at, 5, "rank {rank}");
        }
    }
    let mut second = first.clone();
    second.steps = Some(13);
    second.resume = true;
    let resumed = results(train_threads(&second, &data, Some(resumed_dir.path()), None).unwrap());

    for (a, b) in straight.iter().zip(&resumed) {
        assert_eq!(a.iterations, 13);
        assert_eq!(b.iterations, 13);
        assert_eq!(bits(a), bits(b), "rank {} differs after resume", a.rank);
    }
    // Local steps happened: ranks hold different models (so the test covers per-rank state).
    if algorithm != AlgorithmKind::Ddp {
        assert_ne!(bits(&straight[0]), bits(&straight[1]));
    }
}

#[test]
fn post_local_sgd_with_momentum_resumes_bit_identically() {
    check_resume(AlgorithmKind::PostLocalSgd, OptimizerKind::Sgd);
}

#[test]
fn overlapped_post_local_sgd_resumes_bit_identically_with_averages_pending() {
    // Period 2 after warmup 3, overlap 2: averages start at steps 3, 5, 7, 9, 11 and are applied
    // two steps later, so the checkpoints after iterations 4 and 7 (the stop) each hold a
    // pending average, and the last one (started at 11) is applied at the end.
    check_resume_overlapped(AlgorithmKind::PostLocalSgd, OptimizerKind::Sgd, 2);
}

/// The learning-rate schedule continues where it stopped (a step decay at 3, 6, 9, 12 crosses
/// the stop at 7), with clipping and 2 micro-batches per step (data position mid-accumulation
/// boundaries).
#[test]
fn schedules_clipping_and_accumulation_resume_bit_identically() {
    check_resume_with(AlgorithmKind::PostLocalSgd, OptimizerKind::Sgd, 0, |c| {
        c.lr_schedule = localsgd_trainer::config::LrScheduleKind::Step;
        c.lr_step_size = 3;
        c.lr_gamma = 0.5;
        c.clip_grad_norm = 0.5;
        c.accumulate = 2;
    });
    // (Not cosine here: its T_max is the run's length, which this test changes at the resume.)
    check_resume_with(AlgorithmKind::Ddp, OptimizerKind::Adamw, 0, |c| {
        c.lr_schedule = localsgd_trainer::config::LrScheduleKind::LinearWarmup;
        c.lr_warmup_steps = 10;
        c.weight_decay = Some(0.1);
    });
}

/// DiLoCo syncs after steps 5, 8 and 11 (warmup 3, period 3): the stop at 7 is mid-round, so
/// the checkpoint must carry θ and the outer Nesterov momentum; the last step is local, so
/// the ranks' models differ at the end.
#[test]
fn diloco_resumes_bit_identically_with_theta_and_outer_momentum() {
    check_resume_with(AlgorithmKind::Diloco, OptimizerKind::Sgd, 0, |c| {
        c.levels = Default::default();
        c.period = Some(3);
    });
}

/// Compressed averages (semantics §11.2) carry θ (the last average) and every rank's
/// error-feedback residual over the stop: post-local SGD with stochastic int4 averages after
/// steps 3, 5, 7, 9, 11, hierarchical averaging compresses its world level (every 5 steps).
#[test]
fn compressed_averages_resume_bit_identically_with_theta_and_residuals() {
    use localsgd_trainer::config::{AverageCompressionKind, AverageRounding};
    check_resume_with(AlgorithmKind::PostLocalSgd, OptimizerKind::Sgd, 0, |c| {
        c.average_compression = Some("int4".parse::<AverageCompressionKind>().unwrap());
        c.average_compression_chunk = Some(16);
        c.average_rounding = Some(AverageRounding::Stochastic);
    });
    check_resume_with(AlgorithmKind::Hierarchical, OptimizerKind::Adam, 0, |c| {
        c.average_compression = Some("topk:0.25+int8".parse::<AverageCompressionKind>().unwrap());
    });
}

/// SlowMo's slow step divides by the inner learning rate, which a step schedule changes
/// across the stop; with levels, the lower level averages plainly and the world level (every
/// 5 steps) takes the slow step.
#[test]
fn slowmo_with_a_schedule_and_levels_resumes_bit_identically() {
    check_resume_with(AlgorithmKind::Slowmo, OptimizerKind::Sgd, 0, |c| {
        c.levels = "2:1,5:2".parse().unwrap();
        c.outer_momentum = Some(0.9);
        c.outer_lr = Some(0.7);
        c.lr_schedule = localsgd_trainer::config::LrScheduleKind::Step;
        c.lr_step_size = 3;
        c.lr_gamma = 0.5;
    });
}

fn streaming(c: &mut TrainConfig) {
    c.algorithm = AlgorithmKind::StreamingDiloco;
    c.levels = Default::default();
    c.warmup = 2;
    c.period = Some(4);
    c.fragments = Some(2);
    c.fragment_sync_delay = Some(1);
    c.fragment_alpha = Some(0.5);
}

/// Streaming DiLoCo, 2 fragments, τ = 1, α = 0.5, warmup 2, period 4: fragments prepare after
/// steps 2, 4, 6, ... (0-based) and take their outer step one step later. The stop after 7
/// iterations falls between fragment 0's prepare (step 6) and its outer step (7), so the
/// checkpoint carries the averaged pseudo-gradient in flight; the resumed run equals the
/// uninterrupted one bit for bit.
#[test]
fn streaming_diloco_resumes_bit_identically_with_a_pseudo_gradient_in_flight() {
    check_resume_with(
        AlgorithmKind::StreamingDiloco,
        OptimizerKind::Sgd,
        0,
        streaming,
    );

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(
        dir.path(),
        AlgorithmKind::StreamingDiloco,
        OptimizerKind::Sgd,
    );
    streaming(&mut cfg);
    cfg.steps = Some(7);
    let data = load_data(&cfg).unwrap();
    train_threads(&cfg, &data, Some(dir.path()), None).unwrap();
    let spec = cfg.algorithm_spec().unwrap();
    let identity = localsgd_trainer::run::run_identity(&spec, cfg.workers);
    let ckpts = localsgd_pipeline::checkpoint::CheckpointDir::new(dir.path());
    for rank in 0..cfg.workers {
        let outer = ckpts.load_rank(rank, &identity).unwrap().outer.unwrap();
        assert_eq!(outer.fragments.len(), 2);
        assert_eq!(outer.outer_steps, 2, "fragments 0 and 1 stepped at 3 and 5");
        let pending = outer
            .pending
            .expect("a pseudo-gradient in flight at the stop");
        assert_eq!(pending.fragment, 0, "rank {rank}");
    }
}

/// A checkpoint of an outer averager without its outer state (an older format, or a damaged
/// writer) is refused instead of re-taking θ from replicas that have drifted apart.
#[test]
fn an_outer_run_without_saved_outer_state_is_refused() {
    use localsgd_pipeline::checkpoint::CheckpointDir;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), AlgorithmKind::Diloco, OptimizerKind::Sgd);
    cfg.levels = Default::default();
    cfg.steps = Some(4);
    let data = load_data(&cfg).unwrap();
    train_threads(&cfg, &data, Some(dir.path()), None).unwrap();
    let spec = cfg.algorithm_spec().unwrap();
    let identity = localsgd_trainer::run::run_identity(&spec, cfg.workers);
    let ckpts = CheckpointDir::new(dir.path());
    let stripped: Vec<_> = (0..cfg.workers)
        .map(|rank| {
            let mut ckpt = ckpts.load_rank(rank, &identity).unwrap();
            let outer = ckpt.outer.take().expect("an outer state in the checkpoint");
            assert_eq!(outer.outer_steps, 0, "no sync before step 5");
            ckpt
        })
        .collect();
    // The same checkpoint written again without the outer state.
    ckpts.begin(4).unwrap();
    for ckpt in &stripped {
        ckpts.write_rank(4, ckpt).unwrap();
    }
    ckpts.commit(4, &identity).unwrap();
    let mut again = cfg.clone();
    again.resume = true;
    again.steps = Some(8);
    let err = train_threads(&again, &data, Some(dir.path()), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds no outer-optimizer state"), "{err}");
}

#[test]
fn hierarchical_with_adam_resumes_bit_identically() {
    check_resume(AlgorithmKind::Hierarchical, OptimizerKind::Adam);
}

#[test]
fn resuming_with_another_world_size_or_algorithm_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), AlgorithmKind::PostLocalSgd, OptimizerKind::Sgd);
    cfg.steps = Some(4);
    let data = load_data(&cfg).unwrap();
    train_threads(&cfg, &data, Some(dir.path()), None).unwrap();

    let mut other = cfg.clone();
    other.resume = true;
    other.steps = Some(8);
    other.workers = 1;
    let err = train_threads(&other, &data, Some(dir.path()), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2 workers") && err.contains("this run has 1"),
        "{err}"
    );

    let mut other = cfg.clone();
    other.resume = true;
    other.steps = Some(8);
    other.period = Some(3);
    let err = train_threads(&other, &data, Some(dir.path()), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("algorithm settings") && err.contains("period=Some(3)"),
        "{err}"
    );

    let empty = tempfile::tempdir().unwrap();
    let mut other = cfg.clone();
    other.resume = true;
    let err = train_threads(&other, &data, Some(empty.path()), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no checkpoint to resume from"), "{err}");
}
