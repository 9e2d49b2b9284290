//! Config parsing and validation under random input (property tests, a bounded number of
//! cases): random text, and TOML documents that set random known
//! keys to values of every type and size (negative, huge, NaN, empty, nested). Parsing and
//! validation return an error or a configuration, never panic; every error names the key at
//! fault; a configuration that validates survives its own TOML (`to_toml`, what the run
//! directory's `config.toml` holds) unchanged.

use localsgd_trainer::config::TrainConfig;
use proptest::prelude::*;

/// Every key of the configuration file.
fn keys() -> Vec<String> {
    let text = TrainConfig::default().to_toml();
    let table: toml::Table = toml::from_str(&text).unwrap();
    let mut keys: Vec<String> = table.keys().cloned().collect();
    // Keys whose default is absent from the file (an unset option).
    for k in [
        "steps",
        "outer-lr",
        "outer-momentum",
        "outer-nesterov",
        "outer-reduce",
        "average-compression",
        "average-compression-chunk",
        "average-rounding",
        "average-error-feedback",
        "fragments",
        "fragment-sync-delay",
        "fragment-alpha",
        "init-weights",
        "data-dir",
        "warmup-epochs",
        "config",
    ] {
        if !keys.iter().any(|x| x == k) {
            keys.push(k.to_string());
        }
    }
    keys
}

fn value() -> impl Strategy<Value = toml::Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(toml::Value::Integer),
        (-3i64..70).prop_map(toml::Value::Integer),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(-0.0),
            -2.0..2.0f64
        ]
        .prop_map(toml::Value::Float),
        any::<bool>().prop_map(toml::Value::Boolean),
        prop_oneof![
            "[a-z0-9:,.\\-]{0,12}",
            Just("2:2,4:4".to_string()),
            Just("ddp".to_string()),
            Just("diloco".to_string()),
            Just("streaming-diloco".to_string()),
            Just("fp16".to_string()),
            Just("int8".to_string()),
            Just("topk:0.1+int4".to_string()),
            Just("stochastic".to_string()),
            Just("synthetic".to_string()),
        ]
        .prop_map(toml::Value::String),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        proptest::collection::vec(inner, 0..4).prop_map(toml::Value::Array)
    })
}

fn document() -> impl Strategy<Value = String> {
    let keys = keys();
    proptest::collection::vec((proptest::sample::select(keys), value()), 0..8).prop_map(|kv| {
        let mut table = toml::Table::new();
        for (k, v) in kv {
            table.insert(k, v);
        }
        toml::to_string(&table).unwrap_or_default()
    })
}

/// Parse and validate; on success, the configuration's own TOML parses back to itself.
fn check(text: &str) -> Result<(), TestCaseError> {
    let cfg = match TrainConfig::from_toml_str(text) {
        Ok(cfg) => cfg,
        Err(_) => return Ok(()),
    };
    match cfg.validate() {
        Ok(()) => {
            let again = TrainConfig::from_toml_str(&cfg.to_toml())
                .map_err(|e| TestCaseError::fail(format!("own TOML refused: {e}\n{text}")))?;
            prop_assert_eq!(again, cfg);
        }
        Err(e) => {
            let e = e.to_string();
            prop_assert!(
                keys().iter().any(|k| e.contains(&format!("`{k}`"))),
                "the error names no setting: {}\n{}",
                e,
                text
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_documents_parse_validate_or_name_the_key(text in document()) {
        check(&text)?;
    }

    #[test]
    fn random_text_never_panics(text in "\\PC{0,80}") {
        check(&text)?;
    }
}
