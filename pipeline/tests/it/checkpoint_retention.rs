//! Checkpoints by count: publishing keeps the newest `keep_last` checkpoints up to `latest`,
//! never `latest` itself nor a sealed one newer than it (about to be published).

use localsgd_pipeline::checkpoint::{CheckpointDir, RunIdentity};
use std::path::Path;

fn sealed(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    names.sort();
    names
}

/// A sealed checkpoint of `n` iterations with only a manifest (pruning reads no rank file).
fn seal(dir: &CheckpointDir, n: u64) {
    dir.begin(n).unwrap();
    dir.seal(
        n,
        &RunIdentity {
            world_size: 1,
            algorithm: "test".into(),
            members: vec![],
        },
    )
    .unwrap();
}

#[test]
fn prune_keeps_the_newest_up_to_latest_and_anything_newer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = CheckpointDir::new(tmp.path());
    // Nothing published yet: nothing to prune.
    assert_eq!(dir.prune(1).unwrap(), Vec::<u64>::new());
    for n in [10, 20, 30, 40] {
        seal(&dir, n);
        dir.publish(n).unwrap();
    }
    // Sealed, not yet published: newer than `latest`.
    seal(&dir, 50);
    // A checkpoint in progress.
    dir.begin(60).unwrap();
    assert_eq!(
        dir.prune(0).unwrap(),
        Vec::<u64>::new(),
        "0 keeps every one"
    );
    assert_eq!(dir.prune(2).unwrap(), vec![10, 20]);
    assert_eq!(
        sealed(tmp.path()),
        [
            "step-00000030",
            "step-00000040",
            "step-00000050",
            "step-00000060.tmp"
        ]
    );
    assert_eq!(dir.prune(1).unwrap(), vec![30]);
    assert_eq!(dir.latest_iterations().unwrap(), 40);
    assert_eq!(
        sealed(tmp.path()),
        ["step-00000040", "step-00000050", "step-00000060.tmp"]
    );
    dir.publish(50).unwrap();
    assert_eq!(dir.prune(1).unwrap(), vec![40]);
    assert_eq!(sealed(tmp.path()), ["step-00000050", "step-00000060.tmp"]);
}
