//! Which algorithm takes which setting is said once, in `AlgorithmSetting::applies_to`: giving
//! an algorithm one such setting (a valid value) is accepted exactly where the table says it
//! applies and otherwise refused naming it, and `TrainConfig::for_algorithm` (what `localsgd
//! compare` trains each algorithm with) keeps exactly the settings that apply.

use localsgd_pipeline::settings::{AlgorithmKind, AlgorithmSetting};
use localsgd_trainer::config::TrainConfig;

/// What a 4-worker run of `kind` needs before any optional setting: hierarchical averaging its
/// levels.
fn base(kind: AlgorithmKind) -> String {
    let mut toml = format!("workers = 4\nalgorithm = \"{}\"\n", kind.name());
    if kind == AlgorithmKind::Hierarchical {
        toml.push_str("levels = \"2:2,8:4\"\n");
    }
    toml
}

/// A valid value of `setting` for `kind`, as TOML lines (the settings a lossy codec's options
/// need come with them).
fn given(setting: AlgorithmSetting, kind: AlgorithmKind) -> String {
    use AlgorithmSetting as S;
    let lossy = "average-compression = \"int8\"\n";
    match setting {
        S::Warmup => "warmup = 4".into(),
        S::WarmupEpochs => "warmup-epochs = 1".into(),
        S::Period => "period = 6".into(),
        S::Levels => "levels = \"2:2,6:4\"".into(),
        S::Overlap => "overlap = 1".into(),
        S::Compression => "compression = \"fp16\"".into(),
        S::BucketCapMb => "bucket-cap-mb = 10.0".into(),
        S::FirstBucketMb => "first-bucket-mb = 2.0".into(),
        S::PipelineBuckets => "pipeline-buckets = \"on\"".into(),
        S::OuterLr => "outer-lr = 0.5".into(),
        S::OuterMomentum => "outer-momentum = 0.8".into(),
        S::OuterNesterov => "outer-nesterov = false".into(),
        // SlowMo's one reduction; the others' default.
        S::OuterReduce if kind == AlgorithmKind::Slowmo => {
            "outer-reduce = \"delta-of-mean\"".into()
        }
        S::OuterReduce => "outer-reduce = \"mean-of-deltas\"".into(),
        S::AverageCompression => lossy.into(),
        S::AverageCompressionChunk => format!("{lossy}average-compression-chunk = 512"),
        S::AverageRounding => format!("{lossy}average-rounding = \"stochastic\""),
        S::AverageErrorFeedback => format!("{lossy}average-error-feedback = false"),
        S::AverageExchange => format!("{lossy}average-exchange = \"all-gather\""),
        S::Fragments => "fragments = 2".into(),
        S::FragmentSyncDelay => "fragment-sync-delay = 1".into(),
        S::FragmentAlpha => "fragment-alpha = 0.5".into(),
        S::SlowmoFrequency => "slowmo-frequency = 6".into(),
    }
}

/// The algorithms each setting applies to, as the configuration reference documents them
/// (book/src/configuration.md).
const DOCUMENTED: [(&str, &str); 22] = [
    (
        "warmup",
        "local-sgd post-local-sgd hierarchical diloco streaming-diloco slowmo",
    ),
    (
        "warmup-epochs",
        "local-sgd post-local-sgd hierarchical diloco streaming-diloco slowmo",
    ),
    (
        "period",
        "local-sgd post-local-sgd diloco streaming-diloco slowmo",
    ),
    ("levels", "hierarchical diloco slowmo"),
    ("overlap", "local-sgd post-local-sgd"),
    (
        "compression",
        "ddp post-local-sgd hierarchical diloco streaming-diloco slowmo",
    ),
    (
        "bucket-cap-mb",
        "ddp post-local-sgd hierarchical diloco streaming-diloco slowmo",
    ),
    (
        "first-bucket-mb",
        "ddp post-local-sgd hierarchical diloco streaming-diloco slowmo",
    ),
    (
        "pipeline-buckets",
        "ddp post-local-sgd hierarchical diloco streaming-diloco slowmo",
    ),
    ("outer-lr", "diloco streaming-diloco slowmo"),
    ("outer-momentum", "diloco streaming-diloco slowmo"),
    ("outer-nesterov", "diloco streaming-diloco slowmo"),
    ("outer-reduce", "diloco streaming-diloco slowmo"),
    (
        "average-compression",
        "local-sgd post-local-sgd hierarchical diloco streaming-diloco",
    ),
    (
        "average-compression-chunk",
        "local-sgd post-local-sgd hierarchical diloco streaming-diloco",
    ),
    (
        "average-rounding",
        "local-sgd post-local-sgd hierarchical diloco streaming-diloco",
    ),
    (
        "average-error-feedback",
        "local-sgd post-local-sgd hierarchical diloco streaming-diloco",
    ),
    (
        "average-exchange",
        "local-sgd post-local-sgd hierarchical diloco streaming-diloco",
    ),
    ("fragments", "streaming-diloco"),
    ("fragment-sync-delay", "streaming-diloco"),
    ("fragment-alpha", "streaming-diloco"),
    ("slowmo-frequency", "slowmo"),
];

#[test]
fn the_table_is_the_documented_one() {
    for (setting, (name, users)) in AlgorithmSetting::ALL.into_iter().zip(DOCUMENTED) {
        assert_eq!(setting.name(), name);
        let users: Vec<&str> = users.split(' ').collect();
        for kind in AlgorithmKind::ALL {
            assert_eq!(
                setting.applies_to(kind),
                users.contains(&kind.name()),
                "{name} for {}",
                kind.name()
            );
        }
    }
}

fn config(toml: &str) -> TrainConfig {
    TrainConfig::from_toml_str(toml).unwrap_or_else(|e| panic!("{toml}: {e}"))
}

#[test]
fn each_algorithm_takes_exactly_the_settings_the_table_says() {
    for kind in AlgorithmKind::ALL {
        config(&base(kind))
            .validate()
            .unwrap_or_else(|e| panic!("{}: {e}", kind.name()));
        for setting in AlgorithmSetting::ALL {
            // Hierarchical averaging's levels are part of its base.
            if kind == AlgorithmKind::Hierarchical && setting == AlgorithmSetting::Levels {
                continue;
            }
            let toml = format!("{}{}\n", base(kind), given(setting, kind));
            let checked = config(&toml).validate();
            match (setting.applies_to(kind), checked) {
                (true, Ok(())) => {}
                (true, Err(e)) => panic!("{} refused {}: {e}", kind.name(), setting.name()),
                (false, Ok(())) => {
                    panic!(
                        "{} accepted {}, which it does not take",
                        kind.name(),
                        setting.name()
                    )
                }
                (false, Err(e)) => {
                    // A codec option is refused for its codec when the codec is refused.
                    let named = [setting.name(), "average-compression"]
                        .iter()
                        .any(|n| e.to_string().contains(&format!("`{n}`")));
                    assert!(
                        named,
                        "{} refused {} naming another: {e}",
                        kind.name(),
                        setting.name()
                    );
                }
            }
        }
    }
}

#[test]
fn for_algorithm_keeps_exactly_the_settings_that_apply() {
    // Every setting once (the codec once, for its three options too).
    let mut every = String::from("workers = 4\n");
    for setting in AlgorithmSetting::ALL {
        for line in given(setting, AlgorithmKind::Diloco).lines() {
            if !every.lines().any(|l| l == line) {
                every.push_str(line);
                every.push('\n');
            }
        }
    }
    let all = config(&every);
    let d = TrainConfig::default();
    for kind in AlgorithmKind::ALL {
        let cfg = all.for_algorithm(kind);
        assert_eq!(cfg.algorithm, kind);
        let kept = |s: AlgorithmSetting| match s {
            AlgorithmSetting::Warmup => cfg.warmup != d.warmup,
            AlgorithmSetting::WarmupEpochs => cfg.warmup_epochs.is_some(),
            AlgorithmSetting::Period => cfg.period.is_some(),
            AlgorithmSetting::Levels => !cfg.levels.is_empty(),
            AlgorithmSetting::Overlap => cfg.overlap != d.overlap,
            AlgorithmSetting::Compression => cfg.compression != d.compression,
            AlgorithmSetting::BucketCapMb => cfg.bucket_cap_mb != d.bucket_cap_mb,
            AlgorithmSetting::FirstBucketMb => cfg.first_bucket_mb != d.first_bucket_mb,
            AlgorithmSetting::PipelineBuckets => cfg.pipeline_buckets != d.pipeline_buckets,
            AlgorithmSetting::OuterLr => cfg.outer_lr.is_some(),
            AlgorithmSetting::OuterMomentum => cfg.outer_momentum.is_some(),
            AlgorithmSetting::OuterNesterov => cfg.outer_nesterov.is_some(),
            AlgorithmSetting::OuterReduce => cfg.outer_reduce.is_some(),
            AlgorithmSetting::AverageCompression => cfg.average_compression.is_some(),
            AlgorithmSetting::AverageCompressionChunk => cfg.average_compression_chunk.is_some(),
            AlgorithmSetting::AverageRounding => cfg.average_rounding.is_some(),
            AlgorithmSetting::AverageErrorFeedback => cfg.average_error_feedback.is_some(),
            AlgorithmSetting::AverageExchange => cfg.average_exchange.is_some(),
            AlgorithmSetting::Fragments => cfg.fragments.is_some(),
            AlgorithmSetting::FragmentSyncDelay => cfg.fragment_sync_delay.is_some(),
            AlgorithmSetting::FragmentAlpha => cfg.fragment_alpha.is_some(),
            AlgorithmSetting::SlowmoFrequency => cfg.slowmo_frequency.is_some(),
        };
        for setting in AlgorithmSetting::ALL {
            assert_eq!(
                kept(setting),
                setting.applies_to(kind),
                "{} for {}",
                setting.name(),
                kind.name()
            );
        }
    }
}
