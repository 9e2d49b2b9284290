//! Damaged checkpoints: truncated, bit-flipped, wrong-version and wrong-world-size rank files,
//! and damaged manifests, give a clear error on resume, never a panic, a hang or a huge allocation (property tests over
//! real checkpoints of two runs: DiLoCo with Adam, whose file has an outer state, and overlapped
//! post-local SGD with momentum, whose file has a pending average).
//!
//! Each property runs a bounded number of cases (48). A failing case is saved by proptest in its
//! regression file next to this test and replayed first from then on; commit that file with the
//! fix. (It found that burn's optimizer-record decoder panics on some damaged records: the
//! restore now turns that into a "damaged" error.)

use localsgd_models::data::TrainTest;
use localsgd_trainer::config::{AlgorithmKind, DatasetKind, OptimizerKind, TrainConfig};
use localsgd_trainer::run::{RunError, load_data, train_threads};
use proptest::prelude::*;
use std::path::Path;

/// A finished 2-rank run with a checkpoint after 4 iterations, and rank 0's file bytes.
struct Saved {
    _dir: tempfile::TempDir,
    cfg: TrainConfig,
    data: TrainTest,
    bytes: Vec<u8>,
}

fn saved(algorithm: AlgorithmKind, optimizer: OptimizerKind, overlap: u64) -> Saved {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig {
        workers: 2,
        algorithm,
        warmup: 1,
        period: Some(2),
        overlap,
        dataset: DatasetKind::Synthetic,
        synthetic_samples: 96,
        synthetic_dim: 6,
        synthetic_classes: 3,
        hidden: vec![8],
        batch_size: 8,
        optimizer,
        lr: 0.05,
        steps: Some(4),
        checkpoint_every: 4,
        run_dir: dir.path().to_path_buf(),
        progress: false,
        ..TrainConfig::default()
    };
    let data = load_data(&cfg).unwrap();
    train_threads(&cfg, &data, Some(dir.path()), None).unwrap();
    let bytes = std::fs::read(dir.path().join("checkpoints/step-00000004/rank-0.ckpt")).unwrap();
    Saved {
        _dir: dir,
        cfg,
        data,
        bytes,
    }
}

/// Resume a copy of `s`'s run directory with rank 0's file replaced by `bytes` (each case in its
/// own directory: a resume writes checkpoints of its own, and cases run in parallel); the error,
/// if any.
fn resume_with(s: &Saved, bytes: &[u8], workers: usize) -> Result<(), String> {
    resume_with_manifest(s, bytes, None, workers)
}

/// [`resume_with`], with the manifest replaced by `manifest` when given.
fn resume_with_manifest(
    s: &Saved,
    bytes: &[u8],
    manifest: Option<&[u8]>,
    workers: usize,
) -> Result<(), String> {
    let copy = tempfile::tempdir().unwrap();
    let step = Path::new("checkpoints/step-00000004");
    std::fs::create_dir_all(copy.path().join(step)).unwrap();
    for name in [
        "checkpoints/latest",
        "checkpoints/step-00000004/manifest.json",
    ] {
        std::fs::copy(s.cfg.run_dir.join(name), copy.path().join(name)).unwrap();
    }
    if let Some(m) = manifest {
        std::fs::write(copy.path().join(step).join("manifest.json"), m).unwrap();
    }
    for rank in 1..s.cfg.workers {
        let name = step.join(format!("rank-{rank}.ckpt"));
        std::fs::copy(s.cfg.run_dir.join(&name), copy.path().join(&name)).unwrap();
    }
    std::fs::write(copy.path().join(step).join("rank-0.ckpt"), bytes).unwrap();
    let mut cfg = s.cfg.clone();
    cfg.resume = true;
    cfg.steps = Some(6);
    cfg.workers = workers;
    cfg.run_dir = copy.path().to_path_buf();
    train_threads(&cfg, &s.data, Some(copy.path()), None)
        .map(|_| ())
        .map_err(|e: RunError| e.to_string())
}

/// Whether a run's error is a worker's panic ("rank R panicked: ...").
fn worker_panicked(err: &str) -> bool {
    err.starts_with("rank ") && err.contains(" panicked: ")
}

/// A clear refusal of a damaged file: names rank 0's file and says it is damaged, and no worker
/// panicked.
fn assert_damaged(err: &str) {
    assert!(!worker_panicked(err), "a worker panicked: {err}");
    assert!(
        err.contains("is damaged or not a localsgd checkpoint") && err.contains("rank-0.ckpt"),
        "not a clear 'damaged' error naming rank 0's file: {err}"
    );
}

fn runs() -> &'static [Saved; 2] {
    static RUNS: std::sync::OnceLock<[Saved; 2]> = std::sync::OnceLock::new();
    RUNS.get_or_init(|| {
        [
            saved(AlgorithmKind::Diloco, OptimizerKind::Adam, 0),
            saved(AlgorithmKind::PostLocalSgd, OptimizerKind::Sgd, 1),
        ]
    })
}

#[test]
fn the_saved_files_resume() {
    for s in runs() {
        resume_with(s, &s.bytes, 2).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any truncation (including to nothing) is refused as damaged.
    #[test]
    fn truncated_files_are_refused(which in 0..2usize, cut in 0.0..1.0f64) {
        let s = &runs()[which];
        let len = ((s.bytes.len() as f64) * cut) as usize;
        let err = resume_with(s, &s.bytes[..len], 2).unwrap_err();
        assert_damaged(&err);
    }

    /// Flipping 1 to 8 bits anywhere is refused as damaged (the CRC-32, or the header checks
    /// before it).
    #[test]
    fn bit_flips_are_refused(
        which in 0..2usize,
        flips in proptest::collection::vec((0.0..1.0f64, 0..8u8), 1..=8),
    ) {
        let s = &runs()[which];
        let mut bytes = s.bytes.clone();
        for (at, bit) in &flips {
            let i = ((bytes.len() as f64) * at) as usize;
            bytes[i] ^= 1 << bit;
        }
        prop_assume!(bytes != s.bytes); // two flips of one bit cancel
        let err = resume_with(s, &bytes, 2).unwrap_err();
        assert_damaged(&err);
    }

    /// Damage behind a valid checksum (a file rewritten by a buggy tool, or crafted): random
    /// bytes overwritten in the metadata, parameters, optimizer record or outer state, the CRC
    /// recomputed. The decoders behind the checksum (JSON, burn's record, the outer state) must
    /// refuse or accept, never panic or allocate without bound.
    #[test]
    fn damage_behind_a_valid_checksum_never_panics(
        which in 0..2usize,
        edits in proptest::collection::vec((0.0..1.0f64, any::<u8>()), 1..=16),
    ) {
        let s = &runs()[which];
        let body_len = s.bytes.len() - 4;
        let mut bytes = s.bytes[..body_len].to_vec();
        for (at, value) in &edits {
            // Past the 12-byte header (magic and format), before the checksum.
            let i = 12 + (((body_len - 12) as f64) * at) as usize;
            bytes[i.min(body_len - 1)] = *value;
        }
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        if let Err(err) = resume_with(s, &bytes, 2) {
            prop_assert!(!worker_panicked(&err), "a worker panicked: {}", err);
        }
    }

    /// A damaged manifest (truncated, or random bytes overwritten) is refused with a clear
    /// error (not a valid manifest, or another run's identity), or, where the damage left it
    /// valid, the run resumes; never a panic.
    #[test]
    fn damaged_manifests_are_refused_or_harmless(
        which in 0..2usize,
        cut in 0.0..1.0f64,
        edits in proptest::collection::vec((0.0..1.0f64, any::<u8>()), 0..6),
    ) {
        let s = &runs()[which];
        let original = std::fs::read(
            s.cfg.run_dir.join("checkpoints/step-00000004/manifest.json"),
        ).unwrap();
        let mut manifest = original[..((original.len() as f64) * cut) as usize].to_vec();
        for (at, value) in &edits {
            let len = manifest.len();
            if len > 0 {
                manifest[(((len as f64) * at) as usize).min(len - 1)] = *value;
            }
        }
        if let Err(err) = resume_with_manifest(s, &s.bytes, Some(&manifest), 2) {
            prop_assert!(!worker_panicked(&err), "a worker panicked: {}", err);
            prop_assert!(
                err.contains("is not a valid checkpoint manifest")
                    || err.contains("cannot resume: the checkpoint in"),
                "{}",
                err
            );
        }
    }

    /// A format this build does not know is refused with the format named.
    #[test]
    fn unknown_formats_are_refused(which in 0..2usize, format in 5..u32::MAX) {
        let s = &runs()[which];
        let mut bytes = s.bytes.clone();
        bytes[8..12].copy_from_slice(&format.to_le_bytes());
        let err = resume_with(s, &bytes, 2).unwrap_err();
        assert_damaged(&err);
        prop_assert!(err.contains(&format!("format {format}, expected 1 to 4")), "{}", err);
    }
}

/// A resume with another world size is refused from the manifest, naming both sizes, before
/// any rank file is read.
#[test]
fn another_world_size_is_refused() {
    for s in runs() {
        for workers in [1, 3, 4] {
            let err = resume_with(s, &s.bytes, workers).unwrap_err();
            assert!(
                err.contains("was written by 2 workers")
                    && err.contains(&format!("this run has {workers}")),
                "{err}"
            );
        }
    }
}
