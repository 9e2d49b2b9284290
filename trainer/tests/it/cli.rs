//! The `localsgd` binary end to end: the default run, every bad-input case, and the config
//! reference (TOML keys == command-line flags).

use clap::Args;
use localsgd_trainer::config::ConfigFlags;
use localsgd_trainer::config::TrainConfig;
use std::path::Path;
use std::process::Command;

/// Run the binary with `args` (shared by the modules that drive the binary).
pub(crate) fn localsgd(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn train_end_to_end_writes_the_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = localsgd(&[
        "train",
        "--steps",
        "60",
        "--log-every",
        "10",
        "--checkpoint-every",
        "25",
        "--progress",
        "false",
        "--run-dir",
        run.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The effective configuration is saved, and printed only on request.
    let saved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(saved.contains("algorithm = \"post-local-sgd\""), "{saved}");
    assert!(!stdout.contains("algorithm = "), "{stdout}");
    assert!(stdout.contains("test accuracy:"), "{stdout}");
    for f in [
        "config.toml",
        "metrics.csv",
        "loss.svg",
        "summary.json",
        "checkpoints/latest",
    ] {
        assert!(run.join(f).exists(), "{f} missing");
    }
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert_eq!(
        metrics.lines().count(),
        61,
        "header + one row per iteration"
    );
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "step-00000060");
    assert!(run.join("checkpoints/step-00000050/rank-1.ckpt").exists());
    let saved = TrainConfig::from_toml_file(&run.join("config.toml")).unwrap();
    assert_eq!(saved.steps, Some(60));
}

/// The values of column `name` of a CSV file the binary wrote (`metrics.csv`, `eval.csv`), one
/// per row.
pub(crate) fn csv_column(path: &Path, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let k = header.iter().position(|h| *h == name).unwrap();
    lines
        .map(|l| l.split(',').nth(k).unwrap().to_string())
        .collect()
}

fn assert_rejected(args: &[&str], setting: &str, run: &Path) {
    let out = localsgd(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(stderr.contains(setting), "{args:?}: {stderr}");
    assert!(
        !run.exists(),
        "{args:?} wrote the run directory before validation"
    );
}

#[test]
fn bad_input_is_rejected_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let r = run.to_str().unwrap();
    fn with<'a>(r: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["train", "--run-dir", r];
        v.extend_from_slice(extra);
        v
    }
    let base = |extra: &[&'static str]| with(r, extra);
    assert_rejected(&base(&["--period", "0"]), "`period` = 0", &run);
    // A counter is unsigned: clap refuses a negative one, naming the flag.
    assert_rejected(
        &base(&["--warmup", "-3"]),
        "invalid value '-3' for '--warmup <WARMUP>'",
        &run,
    );
    assert_rejected(
        &base(&["--warmup", "9223372036854775808"]),
        "`warmup` = 9223372036854775808: at most 9223372036854775807",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "hierarchical", "--levels", "2:two"]),
        "invalid value '2:two' for '--levels <LEVELS>': \"2:two\" is not a list of levels",
        &run,
    );
    assert_rejected(&base(&["--workers", "0"]), "`workers` = 0", &run);
    // Far more threads than the machine allows: refused, not an allocator abort.
    assert_rejected(
        &base(&["--workers", "100000000"]),
        "invalid setting `workers` = 100000000: at most",
        &run,
    );
    // Models and data larger than any machine's memory: refused naming the setting and the
    // machine's available memory, before anything is allocated (these used to abort in the
    // allocator: "memory allocation of 25600000000 bytes failed"). The sizes are beyond any
    // machine this runs on.
    for (extra, message) in [
        (
            &["--hidden", "1000000000"][..],
            "invalid setting `hidden` = 1000000000: 2 worker(s) of a 75000000010-parameter MLP (64 -> 1000000000 -> 10) need at least 2.3 TB but this machine has",
        ),
        (
            &["--hidden", "10000000000000,10000000000000"][..],
            "invalid setting `hidden` = 10000000000000,10000000000000:",
        ),
        (
            &[
                "--dataset",
                "synthetic",
                "--synthetic-samples",
                "10000000000",
            ][..],
            "invalid setting `synthetic-samples` = 10000000000 (with `synthetic-dim` = 16): the synthetic data need at least 680.0 GB",
        ),
        (
            &["--dataset", "synthetic", "--synthetic-dim", "1000000000"][..],
            "invalid setting `synthetic-dim` = 1000000000 (with `synthetic-samples` = 2000): the synthetic data need at least 8.0 TB",
        ),
    ] {
        assert_rejected(&with(r, extra), message, &run);
    }
    assert_rejected(
        &base(&["--algorithm", "hierarchical", "--levels", "2:3,4:2"]),
        "invalid setting `levels` = \"2:3,4:2\": level 0 (period 2, group size 3): subgroup size 3 must not exceed the group size 2 (2 workers)",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "hierarchical", "--levels", "4:1,2:2"]),
        "levels must have strictly increasing periods: level 1 (period 2, group size 2) follows level 0",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "hierarchical",
            "--workers",
            "4",
            "--levels",
            "2:2",
        ]),
        "the last level must average over the whole group of 4 ranks",
        &run,
    );
    assert_rejected(&base(&["--dataset", "idx"]), "`data-dir`", &run);
    assert_rejected(
        &base(&["--dataset", "idx", "--data-dir", "/nonexistent/mnist"]),
        "/nonexistent/mnist",
        &run,
    );
    assert_rejected(
        &base(&["--init-weights", "/nonexistent.safetensors"]),
        "`init-weights`",
        &run,
    );
    assert_rejected(&base(&["--lr", "-1"]), "`lr`", &run);
    assert_rejected(&base(&["--batch-size", "0"]), "`batch-size`", &run);
    assert_rejected(&base(&["--algorithm", "fedavg"]), "fedavg", &run);
    assert_rejected(&base(&["--workers", "two"]), "two", &run);
    assert_rejected(
        &base(&["--period", "4", "--overlap", "5"]),
        "`overlap` = 5",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "ddp", "--overlap", "1"]),
        "algorithm `ddp` does not average models",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "hierarchical",
            "--levels",
            "2:2",
            "--overlap",
            "1",
        ]),
        "algorithm `hierarchical` does not support it yet",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "diloco", "--outer-lr", "-0.5"]),
        "`outer-lr` = -0.5: outer averaging: outer lr must be a finite number >= 0",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "slowmo", "--outer-lr", "0"]),
        "`outer-lr` = 0",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "diloco",
            "--outer-momentum",
            "0",
            "--outer-nesterov",
            "true",
        ]),
        "`outer-nesterov` = true: outer averaging: Nesterov momentum requires a momentum",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "slowmo", "--outer-nesterov", "true"]),
        "`outer-nesterov` = true",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "slowmo", "--outer-reduce", "mean-of-deltas"]),
        "`outer-reduce` = mean-of-deltas",
        &run,
    );
    // An averaging algorithm takes only its averages' wire format of the outer settings.
    assert_rejected(
        &base(&["--outer-lr", "0.5"]),
        "`outer-lr` = 0.5: unset: `post-local-sgd` averages models with no outer optimizer; of \
         the outer settings it takes only the averages' wire format",
        &run,
    );
    assert_rejected(
        &base(&["--average-compression", "int8", "--overlap", "2"]),
        "`overlap` = 2: 0 with `average-compression` = int8: a compressed average is applied at its \
         own step",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "slowmo", "--average-compression", "bf16"]),
        "`average-compression` = bf16",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "ddp", "--average-compression", "fp16"]),
        "`average-compression` = fp16: unset: outer settings apply to algorithms `diloco`, \
         `streaming-diloco` and `slowmo` (and `average-compression` to the averages of \
         `local-sgd`, `post-local-sgd` and `hierarchical`), not `ddp`",
        &run,
    );
    // The lossy codecs: a bad codec is refused by clap in the codec's words, the codec's
    // settings where they would do nothing or cannot work.
    assert_rejected(
        &base(&["--algorithm", "diloco", "--average-compression", "topk:1.5"]),
        "invalid value 'topk:1.5' for '--average-compression <AVERAGE_COMPRESSION>': invalid setting \
         `average-compression` = topk:1.5: topk fraction 1.5 is outside (0, 1] (valid: topk:F with \
         0 < F <= 1, optionally +int8 or +int4)",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "diloco", "--average-compression", "int16"]),
        "`average-compression` = int16: one of `none`, `fp16`, `bf16`, `int8`, `int4`, `topk:F`, \
         `topk:F+int8`, `topk:F+int4` (0 < F <= 1)",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "slowmo",
            "--average-compression",
            "topk:0.01+int8",
        ]),
        "`average-compression` = topk:0.01+int8: `none` with `delta-of-mean`",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "diloco",
            "--average-compression",
            "int8",
            "--average-compression-chunk",
            "0",
        ]),
        "`average-compression-chunk` = 0: codec chunk 0 is invalid (valid: chunk >= 1)",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "streaming-diloco",
            "--average-compression",
            "topk:0.1",
            "--average-compression-chunk",
            "65537",
        ]),
        "`average-compression-chunk` = 65537: codec chunk 65537 is too large for topk, whose \
         indices are u16 (valid: 1 <= chunk <= 65536)",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "diloco",
            "--average-compression",
            "fp16",
            "--average-error-feedback",
            "false",
        ]),
        "`average-error-feedback` = false: unset with `average-compression` = fp16: chunks, \
         rounding, error feedback and the exchange are the lossy codecs'",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "streaming-diloco",
            "--average-compression",
            "int8",
            "--fragment-sync-delay",
            "1",
            "--average-exchange",
            "all-reduce",
        ]),
        "`average-exchange` = all-reduce: `auto` or `all-gather` with \
         `fragment-sync-delay` above 0: the quantized all-reduce runs blocking",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "diloco",
            "--average-compression-chunk",
            "256",
        ]),
        "`average-compression-chunk` = 256: unset with `average-compression` = none",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "diloco",
            "--average-compression",
            "topk:0.1",
            "--average-rounding",
            "stochastic",
        ]),
        "`average-rounding` = stochastic: `nearest` (or unset) with `average-compression` = topk:0.1",
        &run,
    );
    assert_rejected(
        &base(&["--average-rounding", "nearest"]),
        "`average-rounding` = nearest: unset with `average-compression` = none",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "diloco", "--average-rounding", "up"]),
        "invalid value 'up' for '--average-rounding <AVERAGE_ROUNDING>'",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "streaming-diloco", "--fragments", "3"]),
        "`fragments` = 3: a number of fragments that divides `period` = 50 (Streaming DiLoCo's \
         sync_every: each fragment syncs every `period` steps, `period / fragments` after the one \
         before) (e.g. 2, 5, 10, 25, 50), or a `period` that 3 divides",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "streaming-diloco",
            "--period",
            "4",
            "--fragments",
            "5",
        ]),
        "Only 1 fragment can be syncrhonized at a time",
        &run,
    );
    assert_rejected(
        &base(&[
            "--algorithm",
            "streaming-diloco",
            "--period",
            "4",
            "--fragment-sync-delay",
            "2",
        ]),
        "`fragment-sync-delay` = 2",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "streaming-diloco", "--fragment-alpha", "1.5"]),
        "`fragment-alpha` = 1.5",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "slowmo", "--fragments", "2"]),
        "`fragments` = 2: unset: fragments, delays and mixing are Streaming DiLoCo's",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "diloco", "--fragment-alpha", "0.5"]),
        "`diloco` syncs all parameters at once",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "streaming-diloco", "--levels", "4:2"]),
        "invalid setting `levels` = \"4:2\": \"\" with `streaming-diloco`",
        &run,
    );
    assert_rejected(
        &base(&["--fragments", "2"]),
        "`fragments` = 2: unset: `post-local-sgd` averages models with no outer optimizer",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "diloco", "--overlap", "1"]),
        "`overlap` = 1",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "diloco", "--period", "0"]),
        "`period` = 0",
        &run,
    );
    assert_rejected(
        &base(&["--algorithm", "diloco", "--levels", "2:3"]),
        "`levels` = \"2:3\": the last level must average over the whole group of 2 ranks",
        &run,
    );

    // Negative numbers reach the setting's own validation (or clap's, naming the flag).
    assert_rejected(
        &base(&["--bucket-cap-mb", "-1"]),
        "invalid setting `bucket-cap-mb` = -1: a positive number of MiB",
        &run,
    );
    assert_rejected(
        &base(&["--workers", "-1"]),
        "invalid value '-1' for '--workers <WORKERS>'",
        &run,
    );
    // A cause is printed once, not once per level of the error chain.
    let passwd = dir.path().join("not-safetensors");
    std::fs::write(&passwd, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    let out = localsgd(&with(r, &["--init-weights", passwd.to_str().unwrap()]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("invalid safetensors data").count(),
        1,
        "{stderr}"
    );
    assert!(
        !run.exists(),
        "a bad init-weights file wrote the run directory"
    );

    let cfg = dir.path().join("bad.toml");
    let c = cfg.to_str().unwrap();
    std::fs::write(&cfg, "perod = 4\n").unwrap();
    assert_rejected(&with(r, &["--config", c]), "unknown field `perod`", &run);
    std::fs::write(&cfg, "workers = \"two\"\n").unwrap();
    assert_rejected(&with(r, &["--config", c]), "workers", &run);
    std::fs::write(&cfg, "period = 0\n").unwrap();
    assert_rejected(&with(r, &["--config", c]), "`period` = 0", &run);
    assert_rejected(
        &base(&["--config", "/nonexistent.toml"]),
        "/nonexistent.toml",
        &run,
    );
}

#[test]
fn flags_override_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.toml");
    std::fs::write(&cfg, "period = 8\nworkers = 4\nhidden = [32, 16]\n").unwrap();
    let flags = ConfigFlags {
        config: Some(cfg),
        workers: Some(2),
        ..Default::default()
    };
    let resolved = flags.resolve().unwrap();
    assert_eq!(resolved.period, Some(8));
    assert_eq!(resolved.workers, 2);
    assert_eq!(resolved.hidden, vec![32, 16]);
}

fn parse_flags(args: &[&str]) -> Result<ConfigFlags, String> {
    use clap::FromArgMatches;
    let cmd = ConfigFlags::augment_args(clap::Command::new("t"));
    let matches = cmd
        .try_get_matches_from(std::iter::once("t").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    ConfigFlags::from_arg_matches(&matches).map_err(|e| e.to_string())
}

#[test]
fn average_compression_takes_every_codec_in_toml_and_flags() {
    use localsgd_averagers::AverageCompression;
    use localsgd_comm::codec::Rounding;
    // (value, the wire format it resolves to; chunk, rounding and error feedback as default).
    for text in [
        "none",
        "fp16",
        "bf16",
        "int8",
        "int4",
        "topk:0.01",
        "topk:0.05+int8",
        "topk:1+int4",
    ] {
        let from_flag = parse_flags(&["--algorithm", "diloco", "--average-compression", text])
            .unwrap()
            .resolve()
            .unwrap();
        let from_toml = TrainConfig::from_toml_str(&format!(
            "algorithm = \"diloco\"\naverage-compression = \"{text}\"\n"
        ))
        .unwrap();
        assert_eq!(from_flag, from_toml, "{text}");
        from_toml.validate().unwrap();
        // The run directory's config.toml gives the same settings back.
        let saved = from_toml.to_toml();
        assert!(
            saved.contains(&format!("average-compression = \"{text}\"")),
            "{saved}"
        );
        assert_eq!(TrainConfig::from_toml_str(&saved).unwrap(), from_toml);
        let outer = from_toml.algorithm_spec().unwrap().outer.unwrap();
        match (text, outer.compression) {
            ("none", None) => {}
            ("fp16" | "bf16", Some(AverageCompression::Half(p))) => assert_eq!(p.to_string(), text),
            (
                _,
                Some(AverageCompression::Lossy {
                    spec,
                    error_feedback: true,
                    ..
                }),
            ) => {
                assert_eq!(spec.codec.to_string(), text);
                assert_eq!((spec.chunk, spec.rounding), (1024, Rounding::Nearest));
            }
            (_, other) => panic!("{text}: {other:?}"),
        }
    }
    // The codec's settings, as flags and as TOML keys; stochastic rounding draws from `seed`.
    let from_flag = parse_flags(&[
        "--algorithm",
        "streaming-diloco",
        "--seed",
        "9",
        "--average-compression",
        "topk:0.1+int8",
        "--average-compression-chunk",
        "4096",
        "--average-rounding",
        "stochastic",
        "--average-error-feedback",
        "false",
    ])
    .unwrap()
    .resolve()
    .unwrap();
    let from_toml = TrainConfig::from_toml_str(
        "algorithm = \"streaming-diloco\"\nseed = 9\naverage-compression = \"topk:0.1+int8\"\n\
         average-compression-chunk = 4096\naverage-rounding = \"stochastic\"\n\
         average-error-feedback = false\n",
    )
    .unwrap();
    assert_eq!(from_flag, from_toml);
    assert_eq!(
        TrainConfig::from_toml_str(&from_toml.to_toml()).unwrap(),
        from_toml
    );
    let spec = from_toml.algorithm_spec().unwrap();
    let Some(AverageCompression::Lossy {
        spec: codec,
        error_feedback,
        ..
    }) = spec.outer.as_ref().unwrap().compression
    else {
        panic!("not lossy");
    };
    assert_eq!(
        (codec.chunk, codec.rounding, error_feedback),
        (4096, Rounding::Stochastic { seed: 9 }, false)
    );
    // Part of the checkpoint identity (the seed is not).
    assert!(
        spec.identity().contains(
            " average_compression=topk:0.1+int8 average_compression_chunk=4096 \
             average_rounding=stochastic average_error_feedback=false fragments=2"
        ),
        "{}",
        spec.identity()
    );
    // A bad value in the file is named with the key's line, in the codec's words.
    let err = TrainConfig::from_toml_str("average-compression = \"topk:0\"\n").unwrap_err();
    assert!(
        err.contains(
            "invalid setting `average-compression` = topk:0: topk fraction 0 is outside (0, 1]"
        ),
        "{err}"
    );
    assert!(err.contains("line 1"), "{err}");
    let err = TrainConfig::from_toml_str("average-rounding = \"up\"\n").unwrap_err();
    assert!(err.contains("unknown variant `up`"), "{err}");
}

#[test]
fn hidden_takes_a_list_or_nothing() {
    // configuration.md: `--hidden 128,64`; an empty list is a linear classifier.
    let widths = |args: &[&str]| parse_flags(args).unwrap().resolve().unwrap().hidden;
    assert_eq!(widths(&["--hidden", "128,64"]), vec![128, 64]);
    assert_eq!(widths(&["--hidden", "128, 64"]), vec![128, 64]);
    assert_eq!(widths(&["--hidden", ""]), Vec::<usize>::new());
    assert_eq!(widths(&[]), vec![64]);
    let err = parse_flags(&["--hidden", "128,x"]).unwrap_err();
    assert!(err.contains("\"x\" is not a width"), "{err}");
}

#[test]
fn every_setting_is_both_a_toml_key_and_a_flag() {
    let keys: std::collections::BTreeSet<String> =
        match serde_json::to_value(TrainConfig::default()).unwrap() {
            serde_json::Value::Object(m) => m.keys().cloned().collect(),
            other => panic!("{other}"),
        };
    let cmd = ConfigFlags::augment_args(clap::Command::new("t"));
    let flags: std::collections::BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .filter(|l| l != "config")
        .collect();
    assert_eq!(keys, flags);
}

#[test]
fn backends_this_binary_lacks_are_refused_naming_the_feature() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let r = run.to_str().unwrap();
    for (backend, built) in [
        ("mpi", cfg!(feature = "mpi")),
        ("nccl", cfg!(feature = "nccl")),
    ] {
        if built {
            println!("{backend}: built in, not refused (tested by its own test file)");
            continue;
        }
        assert_rejected(
            &["train", "--run-dir", r, "--backend", backend],
            &format!("invalid setting `backend` = {backend}: this binary was built without"),
            &run,
        );
        assert_rejected(
            &["train", "--run-dir", r, "--backend", backend],
            &format!("--features {backend}"),
            &run,
        );
        assert_rejected(
            &["bench-comm", "--backend", backend, "--floats", "16"],
            &format!("--features {backend}"),
            &run,
        );
    }
}

#[test]
fn compare_refuses_a_one_process_per_rank_backend() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    assert_rejected(
        &[
            "compare",
            "--run-dir",
            run.to_str().unwrap(),
            "--backend",
            "mpi",
        ],
        "invalid setting `backend` = mpi for `compare`",
        &run,
    );
}

/// The stdout of a run that must have succeeded (stderr in the failure message).
pub(crate) fn ok(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn eval_every_writes_eval_csv_at_multiples_and_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    ok(&localsgd(&[
        "train",
        "--steps",
        "40",
        "--eval-every",
        "16",
        "--progress",
        "false",
        "--run-dir",
        run.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(run.join("eval.csv")).unwrap();
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    assert_eq!(
        text.lines().next(),
        Some("iteration,train_seconds,test_accuracy")
    );
    let iterations: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(iterations, ["16", "32", "40"]);
    let secs: Vec<f64> = rows.iter().map(|r| r[1].parse().unwrap()).collect();
    assert!(secs.windows(2).all(|w| w[0] < w[1]), "{secs:?}");
    // The last evaluation is rank 0's final model: the summary's own-model accuracy.
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let last: f64 = rows[2][2].parse().unwrap();
    assert_eq!(last, summary["rank0_test_accuracy"].as_f64().unwrap());
    // Every rank's own model: rank 0's entry is the same model as rank0_test_accuracy.
    let ranks = summary["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    assert_eq!(ranks[0]["test_accuracy"], summary["rank0_test_accuracy"]);
    assert!(
        ranks
            .iter()
            .all(|r| r["test_loss"].as_f64().is_some_and(f64::is_finite))
    );
}

/// `localsgd plan`'s schedule against the comm layer's own counters: every iteration's payload
/// bytes of a real run equal the arithmetic, for each algorithm.
#[test]
fn plan_payload_matches_the_metrics_of_a_real_run_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for (name, algorithm, extra, pipelined) in [
        ("ddp", "ddp", vec![], false),
        (
            "post-local-sgd",
            "post-local-sgd",
            vec!["--period", "4"],
            false,
        ),
        ("local-sgd", "local-sgd", vec!["--period", "3"], false),
        // Outer steps after iterations warmup + 3k − 1: the same bytes as an average.
        ("diloco", "diloco", vec!["--period", "3"], false),
        ("slowmo", "slowmo", vec!["--period", "4"], false),
        (
            "diloco-fp16",
            "diloco",
            vec!["--period", "3", "--average-compression", "fp16"],
            false,
        ),
        // A lossy codec: each rank's message all-gathered, its bytes the codec's.
        (
            "diloco-int8",
            "diloco",
            vec![
                "--period",
                "3",
                "--average-compression",
                "int8",
                "--average-compression-chunk",
                "100",
            ],
            false,
        ),
        (
            "diloco-topk",
            "diloco",
            vec![
                "--period",
                "3",
                "--average-compression",
                "topk:0.1+int4",
                "--average-compression-chunk",
                "64",
            ],
            false,
        ),
        (
            "hierarchical",
            "hierarchical",
            vec!["--levels", "2:2,4:4"],
            false,
        ),
        // Compressed averages (semantics §11.2): a DiLoCo sync's bytes at the averager's steps;
        // hierarchical compresses its world level only.
        (
            "post-local-int8",
            "post-local-sgd",
            vec![
                "--period",
                "4",
                "--average-compression",
                "int8",
                "--average-compression-chunk",
                "100",
            ],
            false,
        ),
        (
            "local-sgd-topk",
            "local-sgd",
            vec!["--period", "3", "--average-compression", "topk:0.1+int4"],
            false,
        ),
        (
            "hierarchical-fp16",
            "hierarchical",
            vec!["--levels", "2:2,4:4", "--average-compression", "fp16"],
            false,
        ),
        // Overlapped: the same bytes at the same iterations, plus the helper's communicator.
        (
            "overlapped",
            "post-local-sgd",
            vec!["--period", "4", "--overlap", "2"],
            false,
        ),
        // Pipelined gradient sync (threads default to blocking): the same bytes, plus the
        // non-blocking communicator created in iteration 0.
        ("ddp-pipelined", "ddp", vec![], true),
        (
            "post-local-pipelined",
            "post-local-sgd",
            vec!["--period", "4"],
            true,
        ),
    ] {
        let workers = if algorithm == "hierarchical" {
            "4"
        } else {
            "2"
        };
        let run = dir.path().join(name);
        // The settings both commands share: same schedule, same counters.
        let mut common = vec![
            "--algorithm",
            algorithm,
            "--steps",
            "30",
            "--log-every",
            "7",
        ];
        // DDP has no warmup (train refuses one).
        if algorithm != "ddp" {
            common.extend(["--warmup", "5"]);
        }
        common.extend(&extra);
        let mut args = vec!["train", "--workers", workers, "--progress", "false"];
        args.extend(["--run-dir", run.to_str().unwrap()]);
        args.extend(["--pipeline-buckets", if pipelined { "on" } else { "auto" }]);
        args.extend(&common);
        ok(&localsgd(&args));
        let json = dir.path().join(format!("{name}.json"));
        let mut plan = vec!["plan", "--compute-ms", "1", "--hosts", "1"];
        plan.extend([
            "--ranks-per-host",
            workers,
            "--json",
            json.to_str().unwrap(),
            "--pipeline-buckets",
            if pipelined { "true" } else { "false" },
        ]);
        plan.extend(&common);
        ok(&localsgd(&plan));
        let predicted: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let expected: Vec<(u64, u64)> =
            serde_json::from_value(predicted["predictions"][0]["payload_per_iteration"].clone())
                .unwrap();
        let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
        let header: Vec<&str> = metrics.lines().next().unwrap().split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let (b, d) = (col("bytes"), col("data_bytes"));
        let measured: Vec<(u64, u64)> = metrics
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[b].parse().unwrap(), f[d].parse().unwrap())
            })
            .collect();
        assert_eq!(measured.len(), 30, "{name}");
        assert_eq!(measured, expected, "{name}");
    }
}

#[test]
fn plan_lists_each_iteration_of_a_run_over_a_fresh_shaper() {
    // The unit test `a_run_spends_the_full_bucket_first` through the command: 7500 parameters
    // (30 kB) over 2 hosts at 100 Mbit/s, 0.3 ms of compute, 1 ms latency, a 100 kB burst.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("plan.json");
    let plan = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "plan",
            "--params",
            "7500",
            "--compute-ms",
            "0.3",
            "--overhead-ms",
            "0",
            "--hosts",
            "2",
            "--ranks-per-host",
            "1",
            "--link-gbit",
            "0.1",
            "--latency-us",
            "1000",
            "--piece-latency-us",
            "1000",
            "--burst-bytes",
            "100000",
            "--pipeline-buckets",
            "false",
            "--algorithms",
            "ddp",
            "--steps",
            "40",
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        ok(&localsgd(&args));
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let v = plan(&[]);
    let p = &v["predictions"][0];
    let seconds: Vec<f64> = serde_json::from_value(p["iteration_seconds"].clone()).unwrap();
    assert_eq!(seconds.len(), 40);
    let total: f64 = seconds.iter().sum();
    assert!((p["run_seconds"].as_f64().unwrap() - total).abs() < 1e-12);
    // Iterations 0 ..= 26 leave nothing on the wire; from 28 on, the steady state.
    assert!((seconds[0] - 2.3e-3).abs() < 1e-9, "{}", seconds[0]);
    assert!((seconds[26] - 2.3e-3).abs() < 1e-9, "{}", seconds[26]);
    let steady = p["prediction"]["steady_s"].as_f64().unwrap();
    assert!((steady - 2.509e-3).abs() < 0.001e-3, "{steady}");
    assert!(
        (seconds[39] - steady).abs() < 1e-12,
        "{} {steady}",
        seconds[39]
    );
    // One rank per host: no host level to recommend.
    assert!(v["recommended_levels"].is_null(), "{v}");
    // The same burst passing at 0.1 GB/s, not at once: each of those iterations' 30 kB take
    // 0.3 ms on the wire.
    let v = plan(&["--burst-gbps", "0.1"]);
    let seconds: Vec<f64> =
        serde_json::from_value(v["predictions"][0]["iteration_seconds"].clone()).unwrap();
    assert!((seconds[0] - 2.6e-3).abs() < 1e-9, "{}", seconds[0]);
}

/// With several ranks on several hosts, `plan` recommends hierarchical levels, and planning
/// them gives a communication share within the target.
#[test]
fn plan_recommends_levels_that_meet_the_target() {
    let dir = tempfile::tempdir().unwrap();
    let common = [
        "plan",
        "--params",
        "235146",
        "--compute-ms",
        "0.9",
        "--hosts",
        "4",
        "--ranks-per-host",
        "2",
        "--link-gbit",
        "1",
        "--latency-us",
        "40",
        "--target-comm-share",
        "0.2",
    ];
    let first = dir.path().join("first.json");
    let mut args = common.to_vec();
    args.extend(["--json", first.to_str().unwrap()]);
    let stdout = ok(&localsgd(&args));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&first).unwrap()).unwrap();
    let levels = v["recommended_levels"].as_str().unwrap().to_string();
    assert!(
        stdout.contains(&format!("recommended: hierarchical --levels {levels} ")),
        "{stdout}"
    );
    // Two levels: a host's 2 ranks, then all 8.
    let parts: Vec<&str> = levels.split(',').collect();
    assert_eq!(parts.len(), 2, "{levels}");
    assert!(
        parts[0].ends_with(":2") && parts[1].ends_with(":8"),
        "{levels}"
    );
    let again = dir.path().join("again.json");
    let mut args = common.to_vec();
    args.extend([
        "--algorithms",
        "hierarchical",
        "--levels",
        &levels,
        "--json",
        again.to_str().unwrap(),
    ]);
    ok(&localsgd(&args));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&again).unwrap()).unwrap();
    let share = v["predictions"][0]["prediction"]["comm_share"]
        .as_f64()
        .unwrap();
    assert!(share <= 0.2, "{share}");
}

#[test]
fn plan_and_bench_step_name_bad_values() {
    let out = localsgd(&["plan", "--compute-ms", "-1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--compute-ms -1"), "{err}");
    let out = localsgd(&[
        "plan",
        "--compute-ms",
        "1",
        "--steps",
        "1000001",
        "--json",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--steps 1000001: at most 1000000"), "{err}");
    let out = localsgd(&[
        "plan",
        "--compute-ms",
        "1",
        "--levels",
        "2:3",
        "--algorithms",
        "hierarchical",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`levels`"));
    for (args, expected) in [
        (
            &[
                "--average-compression",
                "fp16",
                "--average-compression-chunk",
                "64",
            ][..],
            "invalid --average-compression-chunk 64: leave it out with --average-compression fp16",
        ),
        (
            &[
                "--average-compression",
                "int8",
                "--average-compression-chunk",
                "0",
            ][..],
            "invalid --average-compression-chunk 0: codec chunk 0 is invalid",
        ),
        (
            &["--average-compression", "topk:2"][..],
            "invalid value 'topk:2' for '--average-compression <AVERAGE_COMPRESSION>'",
        ),
    ] {
        let mut plan = vec!["plan", "--compute-ms", "1", "--algorithms", "diloco"];
        plan.extend(args);
        let out = localsgd(&plan);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{err}");
    }
    let out = localsgd(&["plan", "--compute-ms", "1", "--burst-gbps", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid --burst-gbps 0: must be a positive number"),
        "{err}"
    );
    for (flag, value) in [("--piece-kib", "-1"), ("--piece-latency-us", "inf")] {
        let arg = format!("{flag}={value}");
        let out = localsgd(&["plan", "--compute-ms", "1", &arg]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "invalid {flag} {value}: must be a number at least 0"
            )),
            "{err}"
        );
    }
    let out = localsgd(&["bench-step", "--iters", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--iters 0"));
    let stdout = ok(&localsgd(&["bench-step", "--iters", "5"]));
    assert!(
        stdout.contains("bare burn step: 4810 parameters, batch 32"),
        "{stdout}"
    );
}

/// `bench-step --restart-every N` goes back to the initial weights, a fresh optimizer and the
/// first batch every N iterations: the step after a restart computes the loss the very first
/// step computes, and without the restart the same step computes another.
#[test]
fn bench_step_restart_every_starts_training_again() {
    let dir = tempfile::tempdir().unwrap();
    let last_loss = |name: &str, extra: &[&str]| {
        let json = dir.path().join(name);
        let mut args = vec!["bench-step", "--json", json.to_str().unwrap()];
        args.extend_from_slice(extra);
        ok(&localsgd(&args));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (
            v["last_loss"].as_f64().unwrap(),
            v["restart_every"].as_u64().unwrap(),
        )
    };
    let (first, _) = last_loss("first.json", &["--iters", "1", "--warmup-iters", "0"]);
    // Iterations 0..8 with a restart every 7: iteration 7 is a run's step 0 again.
    let (restarted, every) = last_loss(
        "restarted.json",
        &[
            "--iters",
            "6",
            "--warmup-iters",
            "2",
            "--restart-every",
            "7",
        ],
    );
    let (trained, _) = last_loss("trained.json", &["--iters", "6", "--warmup-iters", "2"]);
    assert_eq!(every, 7);
    assert!(first.is_finite() && first > 0.0, "{first}");
    assert_eq!(restarted, first);
    assert_ne!(trained, first);
}

/// `bench-step --burn-optimizer` steps with burn's own optimizer: the output and the JSON say
/// which one ran, and the first step (before any update) computes the same loss as the fused
/// optimizer's.
#[test]
fn bench_step_burn_optimizer_says_which_optimizer_ran() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let json = dir.path().join(name);
        let mut args = vec![
            "bench-step",
            "--iters",
            "1",
            "--warmup-iters",
            "0",
            "--optimizer",
            "adamw",
            "--json",
            json.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let stdout = ok(&localsgd(&args));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (stdout, v)
    };
    let (fused_out, fused) = run("fused.json", &[]);
    let (burn_out, burn) = run("burn.json", &["--burn-optimizer"]);
    assert!(fused_out.contains("optimizer adamw (fused)"), "{fused_out}");
    assert!(burn_out.contains("optimizer adamw (burn)"), "{burn_out}");
    assert_eq!(fused["optimizer_impl"], "fused");
    assert_eq!(burn["optimizer_impl"], "burn");
    assert_eq!(burn["optimizer"], "adamw");
    assert_eq!(fused["last_loss"], burn["last_loss"]);
}

/// `bench-step --gap-us` spins before each step, off the clock: the command takes at least
/// the gaps, and the steps it reports exclude them.
#[test]
fn bench_step_spins_before_each_step_off_the_clock() {
    let out = localsgd(&["bench-step", "--gap-us", "1000001"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid --gap-us 1000001: give 0 (none) up to 1000000 microseconds"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("gap.json");
    let started = std::time::Instant::now();
    let stdout = ok(&localsgd(&[
        "bench-step",
        "--iters",
        "5",
        "--warmup-iters",
        "1",
        "--gap-us",
        "30000",
        "--json",
        json.to_str().unwrap(),
    ]));
    // 6 steps, each after 30 ms of spinning.
    assert!(started.elapsed() >= std::time::Duration::from_millis(180));
    assert!(
        stdout.contains("each after 30000 µs of spinning"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["gap_us"], 30000);
    let mean = v["mean_ms"].as_f64().unwrap();
    assert!(mean > 0.0 && mean < 30.0, "{mean}");
}

#[test]
fn bench_comm_takes_a_gap_and_refuses_one_over_a_second() {
    let out = localsgd(&["bench-comm", "--gap-us", "1000001"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid --gap-us 1000001"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("latency.json");
    let stdout = ok(&localsgd(&[
        "bench-comm",
        "--workers",
        "2",
        "--floats",
        "1",
        "--reps",
        "1",
        "--gap-us",
        "200",
        "--json",
        json.to_str().unwrap(),
    ]));
    assert!(stdout.contains("each after 200 µs of spinning"), "{stdout}");
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(rows[0]["gap_us"], 200);
    assert_eq!(rows[0]["workers"], 2);
    assert_eq!(rows[0]["floats"], 1);
    // The time per all-reduce is the buffer's bytes over the rate.
    let us = rows[0]["allreduce_us"].as_f64().unwrap();
    let gbps = rows[0]["allreduce_gbps"].as_f64().unwrap();
    assert!(
        (us * gbps * 1e3 - 4.0).abs() < 1e-9,
        "{us} µs at {gbps} GB/s"
    );
}

/// `--wire` times one average in each format and counts its wire bytes as the traffic counters
/// do: on 8 thread ranks, 65,536 values, int8 through the quantized all-reduce sends
/// `2 · 7` blocks of 8 chunks of 1024 + 4 bytes, the all-gather `7` whole messages, fp16 a ring
/// all-reduce's `2 · 7/8 · 2n`; a bad format is refused naming it.
#[test]
fn bench_comm_times_each_wire_format_and_counts_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("wire.json");
    let stdout = ok(&localsgd(&[
        "bench-comm",
        "--workers",
        "8",
        "--floats",
        "65536",
        "--reps",
        "1",
        "--wire",
        "fp16,int8,int8-gather",
        "--json",
        json.to_str().unwrap(),
    ]));
    assert!(stdout.contains("ms/average"), "{stdout}");
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let bytes = |i: usize| rows[i]["wire_bytes"].as_u64().unwrap();
    assert_eq!(
        [&rows[0]["wire"], &rows[1]["wire"], &rows[2]["wire"]],
        ["fp16", "int8", "int8-gather"]
    );
    assert_eq!(bytes(0), 2 * 7 * 2 * 65536 / 8);
    assert_eq!(bytes(1), 2 * 7 * 8 * (1024 + 4));
    assert_eq!(bytes(2), 7 * 64 * (1024 + 4));
    assert!(rows[1]["seconds"].as_f64().unwrap() > 0.0);
    let out = localsgd(&["bench-comm", "--wire", "int9"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown codec \"int9\""), "{err}");
}

#[test]
fn eval_csv_time_continues_across_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_dir = run.to_str().unwrap();
    let common = [
        "--eval-every",
        "8",
        "--progress",
        "false",
        "--run-dir",
        run_dir,
    ];
    let mut first = vec!["train", "--steps", "16"];
    first.extend(common);
    ok(&localsgd(&first));
    let mut second = vec!["train", "--steps", "32", "--resume"];
    second.extend(common);
    ok(&localsgd(&second));
    let text = std::fs::read_to_string(run.join("eval.csv")).unwrap();
    let rows: Vec<(u64, f64)> = text
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap())
        })
        .collect();
    let iterations: Vec<u64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(iterations, [8, 16, 24, 32]);
    assert!(rows.windows(2).all(|w| w[0].1 < w[1].1), "{rows:?}");
}

#[test]
fn a_refused_resume_rewrites_nothing() {
    // The quickstart's order: a 2-worker run, then `--resume` with 4 workers. The checkpoint is
    // refused (configuration.md: the saved config.toml repeats the run), and the run directory
    // is left as the first run wrote it.
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let run_dir = run.to_str().unwrap();
    ok(&localsgd(&[
        "train",
        "--steps",
        "8",
        "--progress",
        "false",
        "--run-dir",
        run_dir,
    ]));
    let files = ["config.toml", "metrics.csv", "summary.json", "loss.svg"];
    let before: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(run.join(f)).unwrap())
        .collect();
    for extra in [&["--workers", "4"][..], &["--period", "8"][..]] {
        let mut args = vec![
            "train",
            "--steps",
            "16",
            "--progress",
            "false",
            // Asked to print it: a refused configuration must still not be printed.
            "--print-config",
            "true",
            "--run-dir",
            run_dir,
            "--resume",
        ];
        args.extend(extra);
        let out = localsgd(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("cannot resume"), "{stderr}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("effective configuration"),
            "printed a configuration it then refused"
        );
    }
    let after: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(run.join(f)).unwrap())
        .collect();
    assert!(
        before == after,
        "the refused resumes changed the run directory"
    );
}

/// Accumulating more micro-batches than the run holds is refused with the numbers that would
/// fit (streamed: the run's epochs; Lightning's rule: one epoch), before anything is written,
/// and `accumulate = 0` names the setting.
#[test]
fn accumulate_beyond_the_data_or_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    for (flags, valid) in [
        (
            ["--epochs", "2", "--accumulation", "stream"],
            "at most 46: the run's epochs give each rank 46 batches of 32",
        ),
        (
            ["--epochs", "2", "--accumulation", "epoch-end"],
            "at most 23: each rank's epoch has 23 batches of 32",
        ),
    ] {
        let mut args = vec!["train", "--progress", "false", "--accumulate", "1000"];
        args.extend(flags);
        args.extend(["--run-dir", run.to_str().unwrap()]);
        let out = localsgd(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("`accumulate` = 1000") && err.contains(valid),
            "{err}"
        );
        assert!(!run.exists(), "a refused run wrote {}", run.display());
    }
    let out = localsgd(&["train", "--progress", "false", "--accumulate", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("accumulate") && err.contains("at least 1"),
        "{err}"
    );
}

/// `warmup-epochs` puts post-local SGD's switch at an epoch boundary: the digits shard of each
/// of 2 ranks is 23 batches of 32, so 1 epoch is a warmup of 23 optimizer steps (12 with 2
/// micro-batches per step streamed across epochs: the 12th takes the epoch's last batch and
/// the next epoch's first). Gradients travel (19,240 bytes) until then; after the switch only
/// the averaging steps send data. Two micro-batches per step process twice the samples in as
/// many steps (the throughput counts every micro-batch).
#[test]
fn warmup_epochs_switch_at_the_epoch_boundary() {
    let dir = tempfile::tempdir().unwrap();
    let mut samples = Vec::new();
    for (accumulate, warmup) in [("1", 23usize), ("2", 12)] {
        let run = dir.path().join(format!("acc{accumulate}"));
        ok(&localsgd(&[
            "train",
            "--progress",
            "false",
            "--algorithm",
            "post-local-sgd",
            "--period",
            "4",
            "--warmup-epochs",
            "1",
            "--accumulate",
            accumulate,
            "--steps",
            "30",
            "--log-every",
            "0",
            "--run-dir",
            run.to_str().unwrap(),
        ]));
        let data: Vec<u64> = csv_column(&run.join("metrics.csv"), "data_bytes")
            .iter()
            .map(|v| v.parse().unwrap())
            .collect();
        for (i, bytes) in data.iter().enumerate() {
            let averaging = i >= warmup && (i - warmup).is_multiple_of(4);
            let want = if i < warmup || averaging { 19_240 } else { 0 };
            assert_eq!(*bytes, want, "accumulate {accumulate}, iteration {i}");
        }
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap())
                .unwrap();
        let rate = summary["samples_per_second"].as_f64().unwrap();
        samples.push((rate * summary["wall_seconds"].as_f64().unwrap()).round());
    }
    assert_eq!(samples[1], 2.0 * samples[0], "{samples:?}");
}

/// The CNN (`--model cnn`) trains end to end with each buffer policy; its BatchNorm running
/// statistics leave their initial values and reach `model.safetensors`. Inputs it cannot take
/// are refused before the run directory exists, naming the numbers.
#[test]
fn cnn_trains_with_each_buffer_policy_and_refuses_shapes_it_cannot_take() {
    let dir = tempfile::tempdir().unwrap();
    for buffers in ["broadcast", "average", "local"] {
        let run = dir.path().join(buffers);
        ok(&localsgd(&[
            "train",
            "--progress",
            "false",
            "--model",
            "cnn",
            "--algorithm",
            "post-local-sgd",
            "--warmup",
            "4",
            "--period",
            "2",
            "--buffers",
            buffers,
            "--steps",
            "8",
            "--run-dir",
            run.to_str().unwrap(),
        ]));
        let bytes = std::fs::read(run.join("model.safetensors")).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let var = file.tensor("norms.1.running_var").unwrap();
        assert_eq!(var.shape(), [16]);
        // 8 updates with momentum 0.1 move every channel's variance away from its initial 1.
        assert!(
            var.data()
                .chunks_exact(4)
                .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) != 1.0),
            "{buffers}: running_var untouched"
        );
    }
    let run = dir.path().join("refused");
    for (args, expected) in [
        (
            &["--dataset", "synthetic", "--synthetic-dim", "10"][..],
            "10 input features is not side x side",
        ),
        (
            &["--channels", "8,16,32,64"][..],
            "side of 8 cannot be halved by 4 pooling blocks",
        ),
    ] {
        let mut all = vec!["train", "--progress", "false", "--model", "cnn"];
        all.extend(args);
        all.extend(["--run-dir", run.to_str().unwrap()]);
        let out = localsgd(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(expected), "{err}");
        assert!(!run.exists(), "{args:?}: the run directory was created");
    }
    assert_rejected(
        &[
            "train",
            "--model",
            "cnn",
            "--channels",
            "8,0",
            "--run-dir",
            run.to_str().unwrap(),
        ],
        "channels",
        &run,
    );
}

/// The settings renamed from `outer-*` to `average-*` are still read under their old names,
/// from flags and from a config file, with a warning naming the new name; both names at once
/// are refused.
#[test]
fn renamed_settings_still_read_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("flag");
    let out = localsgd(&[
        "train",
        "--run-dir",
        run.to_str().unwrap(),
        "--algorithm",
        "diloco",
        "--outer-compression",
        "int8",
        "--outer-compression-chunk",
        "256",
        "--steps",
        "2",
        "--progress",
        "false",
    ]);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for (old, new) in [
        ("outer-compression", "average-compression"),
        ("outer-compression-chunk", "average-compression-chunk"),
    ] {
        assert!(
            stderr.contains(&format!("setting `{old}` is now `{new}`")),
            "{stderr}"
        );
    }
    let saved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(saved.contains("average-compression = \"int8\""), "{saved}");
    assert!(saved.contains("average-compression-chunk = 256"), "{saved}");
    assert!(!saved.contains("outer-compression"), "{saved}");

    let file = dir.path().join("old.toml");
    std::fs::write(
        &file,
        "algorithm = \"diloco\"\nouter-rounding = \"stochastic\"\nouter-compression = \"int4\"\nouter-error-feedback = false\nsteps = 2\nprogress = false\n",
    )
    .unwrap();
    let run = dir.path().join("file");
    let out = localsgd(&[
        "train",
        "--config",
        file.to_str().unwrap(),
        "--run-dir",
        run.to_str().unwrap(),
    ]);
    ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("setting `outer-rounding` is now `average-rounding`"),
        "{stderr}"
    );
    let saved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        saved.contains("average-rounding = \"stochastic\""),
        "{saved}"
    );
    assert!(saved.contains("average-error-feedback = false"), "{saved}");

    std::fs::write(
        &file,
        "algorithm = \"diloco\"\nouter-compression = \"int4\"\naverage-compression = \"int8\"\n",
    )
    .unwrap();
    let out = localsgd(&["train", "--config", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("duplicate field `average-compression`"),
        "{stderr}"
    );
}
