//! Settings the semantics refuse are refused when the strategy is built, naming the setting,
//! the value and what would be valid (PyTorch Lightning's and PyTorch's rules).

use burn::tensor::Device;
use localsgd_learner::{AlgorithmKind, Levels, LocalSgdStrategy, StrategyConfig};

fn refused(config: StrategyConfig, expected: &[&str]) {
    let err = LocalSgdStrategy::new(config, Device::flex())
        .unwrap_err()
        .to_string();
    for e in expected {
        assert!(err.contains(e), "{err:?} lacks {e:?}");
    }
}

#[test]
fn post_local_sgd_without_a_period_is_refused() {
    let mut config = StrategyConfig::post_local_sgd(10, 4);
    config.period = None;
    refused(
        config,
        &["period", "post-local-sgd", "model_averaging_period"],
    );
    let config = StrategyConfig {
        algorithm: AlgorithmKind::LocalSgd,
        ..StrategyConfig::default()
    };
    refused(config, &["period", "local-sgd"]);
}

#[test]
fn a_zero_period_an_oversized_warmup_or_no_workers_is_refused() {
    refused(
        StrategyConfig::post_local_sgd(10, 0),
        &["period", "positive"],
    );
    // A negative warmup cannot be written (`u64`); one past PyTorch's i64 counter is refused.
    refused(
        StrategyConfig::post_local_sgd(u64::MAX, 4),
        &[
            "warmup",
            "18446744073709551615",
            "at most 9223372036854775807",
        ],
    );
    refused(
        StrategyConfig::default().with_workers(0),
        &["workers", "at least 1"],
    );
}

#[test]
fn levels_that_do_not_fit_the_ranks_are_refused() {
    let levels = |text: &str| text.parse::<Levels>().unwrap();
    refused(
        StrategyConfig::hierarchical(10, levels("2:3,4:4")).with_workers(4),
        &["levels", "level 0 (period 2, group size 3)", "4 workers"],
    );
    refused(
        StrategyConfig::hierarchical(10, levels("")).with_workers(4),
        &["levels", "must not be empty"],
    );
    // Text that is not levels never becomes a configuration.
    let err = "2:two".parse::<Levels>().unwrap_err();
    assert!(err.contains("\"2:two\" is not a list of levels"), "{err}");
}

#[test]
fn valid_settings_are_accepted() {
    for config in [
        StrategyConfig::default(),
        StrategyConfig::post_local_sgd(10, 4),
        StrategyConfig::local_sgd(2),
        StrategyConfig::hierarchical(10, "2:2,4:4".parse().unwrap()).with_workers(4),
    ] {
        LocalSgdStrategy::new(config, Device::flex()).unwrap();
    }
}

/// The strategy does not take outer-optimizer steps yet: DiLoCo and SlowMo are refused with
/// the algorithms it does take, not run as something else.
#[test]
fn outer_optimizer_algorithms_are_refused_for_now() {
    for algorithm in [AlgorithmKind::Diloco, AlgorithmKind::Slowmo] {
        let config = StrategyConfig {
            algorithm,
            period: Some(4),
            ..StrategyConfig::default()
        };
        refused(
            config,
            &[
                "`algorithm`",
                algorithm.name(),
                "ddp, local-sgd, post-local-sgd, hierarchical",
            ],
        );
    }
}
