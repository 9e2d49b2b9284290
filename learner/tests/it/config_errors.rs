//! Settings the semantics refuse are refused when the strategy is built, naming the setting,
//! the value and what would be valid (PyTorch Lightning's and PyTorch's rules).

use burn::tensor::Device;
use localsgd_learner::{
    AlgorithmKind, AlgorithmSpec, AverageCompression, AverageCompressionKind, Levels,
    LocalSgdStrategy, StrategyConfig,
};

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
    let mut config = StrategyConfig::new(AlgorithmSpec::post_local_sgd(10, 4));
    config.algorithm.period = None;
    refused(
        config,
        &["period", "post-local-sgd", "model_averaging_period"],
    );
    let config = StrategyConfig::new(AlgorithmSpec {
        kind: AlgorithmKind::LocalSgd,
        ..AlgorithmSpec::default()
    });
    refused(config, &["period", "local-sgd"]);
}

#[test]
fn a_zero_period_an_oversized_warmup_or_no_workers_is_refused() {
    refused(
        StrategyConfig::new(AlgorithmSpec::post_local_sgd(10, 0)),
        &["period", "positive"],
    );
    // A negative warmup cannot be written (`u64`); one past PyTorch's i64 counter is refused.
    refused(
        StrategyConfig::new(AlgorithmSpec::post_local_sgd(u64::MAX, 4)),
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
        StrategyConfig::new(AlgorithmSpec::hierarchical(10, levels("2:3,4:4"))).with_workers(4),
        &["levels", "level 0 (period 2, group size 3)", "4 workers"],
    );
    refused(
        StrategyConfig::new(AlgorithmSpec::hierarchical(10, levels(""))).with_workers(4),
        &["levels", "must not be empty"],
    );
    // Text that is not levels never becomes a configuration.
    let err = "2:two".parse::<Levels>().unwrap_err();
    assert!(err.contains("\"2:two\" is not a list of levels"), "{err}");
}

/// A DiLoCo (or SlowMo) configuration with the pseudo-gradients sent as `codec` (`average-compression`
/// as the binary writes it) in chunks of `chunk`.
fn compressed(mut algorithm: AlgorithmSpec, codec: &str, chunk: usize) -> StrategyConfig {
    let mut c = codec
        .parse::<AverageCompressionKind>()
        .unwrap()
        .compression();
    if let Some(AverageCompression::Lossy { spec, .. }) = &mut c {
        spec.chunk = chunk;
    }
    algorithm.outer.as_mut().unwrap().compression = c;
    StrategyConfig::new(algorithm)
}

#[test]
fn pseudo_gradient_codecs_that_cannot_work_are_refused() {
    refused(
        compressed(AlgorithmSpec::diloco(8), "int8", 0),
        &[
            "`average-compression-chunk` = 0",
            "codec chunk 0 is invalid",
        ],
    );
    refused(
        compressed(
            AlgorithmSpec::streaming_diloco(8, 2),
            "topk:0.1+int4",
            65537,
        ),
        &["`average-compression-chunk` = 65537", "too large for topk"],
    );
    // SlowMo averages the parameters (delta of mean): nothing to compress.
    refused(
        compressed(AlgorithmSpec::slowmo(3, 48), "topk:0.01", 1024),
        &[
            "`average-compression` = topk:0.01",
            "`none` with `delta-of-mean`",
        ],
    );
    refused(
        compressed(AlgorithmSpec::slowmo(3, 48), "fp16", 1024),
        &["`average-compression` = fp16"],
    );
    for codec in [
        "fp16",
        "int8",
        "int4",
        "topk:0.01",
        "topk:0.1+int8",
        "topk:1+int4",
    ] {
        LocalSgdStrategy::new(
            compressed(AlgorithmSpec::diloco(8), codec, 64),
            Device::flex(),
        )
        .unwrap();
    }
}

#[test]
fn valid_settings_are_accepted() {
    for config in [
        StrategyConfig::default(),
        StrategyConfig::new(AlgorithmSpec::post_local_sgd(10, 4)),
        StrategyConfig::new(AlgorithmSpec::local_sgd(2)),
        StrategyConfig::new(AlgorithmSpec::hierarchical(10, "2:2,4:4".parse().unwrap()))
            .with_workers(4),
        StrategyConfig::new(AlgorithmSpec::diloco(8)),
        StrategyConfig::new(AlgorithmSpec::streaming_diloco(8, 2)),
        StrategyConfig::new(AlgorithmSpec::slowmo(3, 48)),
    ] {
        LocalSgdStrategy::new(config, Device::flex()).unwrap();
    }
}

/// An outer-optimizer algorithm without its outer settings is refused by name, not run as
/// post-local SGD.
#[test]
fn an_outer_algorithm_without_its_optimizer_is_refused() {
    for kind in [AlgorithmKind::Diloco, AlgorithmKind::Slowmo] {
        let config = StrategyConfig::new(AlgorithmSpec {
            kind,
            period: Some(4),
            ..AlgorithmSpec::default()
        });
        refused(config, &["outer", kind.name()]);
    }
}

/// An algorithm name that is none of them is refused naming it and every valid one.
#[test]
fn an_unknown_algorithm_name_is_refused_naming_the_valid_ones() {
    let err = AlgorithmKind::from_name("dilocco").unwrap_err().to_string();
    assert!(err.contains("\"dilocco\""), "{err}");
    for name in [
        "ddp",
        "local-sgd",
        "post-local-sgd",
        "hierarchical",
        "diloco",
        "streaming-diloco",
        "slowmo",
    ] {
        assert!(err.contains(name), "{err} lacks {name}");
        assert_eq!(AlgorithmKind::from_name(name).unwrap().name(), name);
    }
}
