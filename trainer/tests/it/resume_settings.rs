//! `localsgd train --resume` keeps the run's own settings: those not given again come from its
//! `config.toml`, those the checkpoint fixes are refused when they differ (naming the setting,
//! the run's value and what to do), those that may change are applied and recorded with the
//! iteration from which they hold; a length already reached is refused; nothing in the run
//! directory changes before every check passed.

use crate::rank_failure::final_params;
use localsgd_trainer::config::{OptimizerKind, TrainConfig};
use localsgd_trainer::history::split_history;
use std::path::Path;
use std::process::{Command, Output};

fn localsgd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args(args)
        .env_remove("LOCALSGD_FAULT")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = localsgd(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{args:?}: {text}");
    text
}

/// A small run with Adam at lr 0.05 (neither the default), 4 workers, `steps` iterations.
fn start(run: &Path, steps: &str) -> Vec<String> {
    [
        "train",
        "--workers",
        "4",
        "--optimizer",
        "adam",
        "--lr",
        "0.05",
        "--period",
        "3",
        "--warmup",
        "4",
        "--checkpoint-every",
        "5",
        "--steps",
        steps,
        "--progress",
        "false",
        "--run-dir",
        run.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec()
}

/// A temporary directory and the run directory inside it.
fn scratch() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    (dir, run)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn files(run: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in walk(run) {
        let bytes = std::fs::read(&entry).unwrap();
        out.push((entry.display().to_string(), bytes));
    }
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all.extend(walk(&path));
        } else {
            all.push(path);
        }
    }
    all
}

/// The case: a run with Adam at lr 0.05 resumed with `--resume --steps 30` continues
/// with Adam at 0.05 and ends with the parameters of the same run trained in one go (an
/// independent reference); the saved `config.toml` records the change of `steps` from
/// iteration 20.
#[test]
fn a_resume_keeps_the_runs_settings_and_equals_the_uninterrupted_run() {
    let (dir, run) = scratch();
    ok(&strs(&start(&run, "20")));
    ok(&[
        "train",
        "--resume",
        "--steps",
        "30",
        "--progress",
        "false",
        "--run-dir",
        run.to_str().unwrap(),
    ]);
    let reference = dir.path().join("reference");
    ok(&strs(&start(&reference, "30")));
    let (_, got) = final_params(&run, "post-local-sgd");
    let (_, want) = final_params(&reference, "post-local-sgd");
    assert_eq!(got.len(), 4);
    assert!(
        got == want,
        "the resumed run differs from the uninterrupted one"
    );

    let text = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let saved = TrainConfig::from_toml_str(&text).unwrap();
    assert_eq!(saved.optimizer, OptimizerKind::Adam);
    assert_eq!(saved.lr, 0.05);
    assert_eq!(saved.workers, 4);
    assert_eq!(saved.steps, Some(30));
    let (_, history) = split_history(&text).unwrap();
    assert_eq!(history.len(), 1, "{text}");
    assert_eq!(history[0]["iteration"].as_integer(), Some(20), "{text}");
    let settings = history[0]["settings"].as_table().unwrap();
    assert_eq!(settings.keys().collect::<Vec<_>>(), ["steps"], "{text}");
    assert_eq!(settings["steps"].as_integer(), Some(30));
    assert_eq!(history[0]["before"]["steps"].as_integer(), Some(20));
    // The file still trains the same when given back.
    let fresh = dir.path().join("again");
    ok(&[
        "train",
        "--config",
        run.join("config.toml").to_str().unwrap(),
        "--run-dir",
        fresh.to_str().unwrap(),
    ]);
    let (_, again) = final_params(&fresh, "post-local-sgd");
    assert!(again == want, "config.toml given back trains another run");
}

/// Settings that may change are applied and recorded (two resumes: two history entries); the
/// learning rate's change shows in the metrics from the resumed iteration on.
#[test]
fn changed_settings_are_applied_and_recorded_with_their_iteration() {
    let (_dir, run) = scratch();
    let run_dir = run.to_str().unwrap();
    ok(&strs(&start(&run, "10")));
    ok(&[
        "train",
        "--resume",
        "--steps",
        "15",
        "--lr",
        "0.01",
        "--log-every",
        "5",
        "--run-dir",
        run_dir,
    ]);
    ok(&[
        "train",
        "--resume",
        "--steps",
        "20",
        "--keep-checkpoints",
        "1",
        "--run-dir",
        run_dir,
    ]);
    let text = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let (_, history) = split_history(&text).unwrap();
    assert_eq!(history.len(), 2, "{text}");
    assert_eq!(history[0]["iteration"].as_integer(), Some(10));
    assert_eq!(history[0]["settings"]["lr"].as_float(), Some(0.01));
    assert_eq!(history[0]["before"]["lr"].as_float(), Some(0.05));
    assert_eq!(history[0]["settings"]["log-every"].as_integer(), Some(5));
    assert_eq!(history[1]["iteration"].as_integer(), Some(15));
    assert_eq!(
        history[1]["settings"]["keep-checkpoints"].as_integer(),
        Some(1)
    );
    let saved = TrainConfig::from_toml_str(&text).unwrap();
    assert_eq!(
        (saved.lr, saved.steps, saved.log_every),
        (0.01, Some(20), 5)
    );
    // The second resume kept lr 0.01 without being told: every iteration from 10 on ran at it.
    let rates: Vec<f64> = crate::cli::csv_column(&run.join("metrics.csv"), "lr")
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
    assert_eq!(rates.len(), 20);
    assert!(rates[..10].iter().all(|&r| r == 0.05), "{rates:?}");
    assert!(rates[10..].iter().all(|&r| r == 0.01), "{rates:?}");
    // keep-checkpoints = 1: only the final checkpoint is left.
    let mut left: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    left.sort();
    assert_eq!(left, ["step-00000020"]);
}

/// Each setting the checkpoint fixes is refused when it differs, naming it, the run's value
/// and what to do; the run directory is byte for byte as before.
#[test]
fn settings_the_checkpoint_fixes_are_refused_and_nothing_is_written() {
    let (_dir, run) = scratch();
    let run_dir = run.to_str().unwrap();
    ok(&strs(&start(&run, "10")));
    let before = files(&run);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--optimizer", "adamw"],
            "cannot resume with `optimizer` = \"adamw\": the run in",
        ),
        (
            &["--optimizer", "adamw"],
            "was started with `optimizer` = \"adam\"",
        ),
        (
            &["--workers", "2", "--hidden", "32"],
            "`workers` = 2: the run in",
        ),
        (&["--workers", "2"], "give `resume-ranks`"),
        (&["--hidden", "32"], "`hidden` = [32]"),
        (&["--model", "cnn"], "cannot resume with `model` = \"cnn\""),
        (&["--seed", "7"], "cannot resume with `seed` = 7"),
        (&["--algorithm", "diloco"], "`algorithm` = \"diloco\""),
        (&["--period", "5"], "cannot resume with `period` = 5"),
        (&["--batch-size", "8"], "`batch-size` = 8"),
        (&["--shuffle", "false"], "`shuffle` = false"),
        (
            &["--momentum", "0.5", "--optimizer", "sgd"],
            "`optimizer` = \"sgd\"",
        ),
        (
            &["--weight-decay-matrices-only", "true"],
            "cannot resume with `weight-decay-matrices-only` = true",
        ),
        (
            &["--weight-decay-matrices-only", "true"],
            "the checkpoint holds that optimizer's state",
        ),
        (&["--steps", "10"], "`steps` = 10 is already reached"),
        (
            &["--steps", "4"],
            "holds 10 iterations; give `steps` above 10",
        ),
    ];
    for (extra, expected) in cases {
        // No `steps` but where a case gives it: the run's 10 are inherited, and each fixed
        // setting is refused before the length is looked at.
        let mut args = vec![
            "train",
            "--resume",
            "--progress",
            "false",
            "--print-config",
            "true",
            "--run-dir",
            run_dir,
        ];
        args.extend(extra.iter());
        let out = localsgd(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("effective configuration"),
            "{extra:?}: printed a configuration it then refused"
        );
        assert!(files(&run) == before, "{extra:?} changed the run directory");
    }
}

/// A run limited by epochs is refused a resume to as many epochs as it has, and continues to
/// more; `resume-ranks` may change the number of workers (recorded).
#[test]
fn epochs_already_reached_are_refused_and_resume_ranks_changes_workers() {
    let (_dir, run) = scratch();
    let run_dir = run.to_str().unwrap();
    ok(&[
        "train",
        "--epochs",
        "1",
        "--progress",
        "false",
        "--run-dir",
        run_dir,
    ]);
    let out = localsgd(&["train", "--resume", "--run-dir", run_dir]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`epochs` = 1 is already reached: the latest checkpoint in"),
        "{stderr}"
    );
    assert!(stderr.contains("holds 1 epochs"), "{stderr}");
    ok(&[
        "train",
        "--resume",
        "--epochs",
        "2",
        "--workers",
        "3",
        "--resume-ranks",
        "0,1,1",
        "--progress",
        "false",
        "--run-dir",
        run_dir,
    ]);
    let text = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let (_, history) = split_history(&text).unwrap();
    assert_eq!(history[0]["settings"]["workers"].as_integer(), Some(3));
    assert_eq!(history[0]["settings"]["epochs"].as_integer(), Some(2));
    assert_eq!(history[0]["before"]["workers"].as_integer(), Some(2));
    // `resume-ranks` says what this invocation does: the file does not keep it.
    assert!(!text.contains("resume-ranks = [0"), "{text}");
}

/// A directory that is no run of the binary (no `config.toml`) is refused by name.
#[test]
fn a_resume_without_the_runs_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = localsgd(&[
        "train",
        "--resume",
        "--run-dir",
        dir.path().to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("config.toml does not exist"), "{stderr}");
}

/// A `--config` file that repeats the run's length settings changes nothing on a resume (only a
/// value other than the run's replaces its length), and a file whose settings stand below the
/// history is refused.
#[test]
fn a_config_file_that_repeats_the_run_and_a_line_below_the_history() {
    let (dir, run) = scratch();
    let run_dir = run.to_str().unwrap();
    let base = dir.path().join("base.toml");
    std::fs::write(&base, "epochs = 30\nlr = 0.05\n").unwrap();
    let base = base.to_str().unwrap();
    // A run of 10 steps that fails after its checkpoint of 5.
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args([
            "train",
            "--config",
            base,
            "--steps",
            "10",
            "--checkpoint-every",
            "5",
        ])
        .args(["--progress", "false", "--run-dir", run_dir])
        .env("LOCALSGD_FAULT", "panic@1:7")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // The same file again: its `epochs` is not a new length, the run still ends at 10 steps.
    let out = ok(&["train", "--config", base, "--resume", "--run-dir", run_dir]);
    assert!(out.contains("trained 10 iterations"), "{out}");
    ok(&["train", "--resume", "--steps", "15", "--run-dir", run_dir]);
    // A setting appended below the history lands in it: refused, not ignored.
    let config = run.join("config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("[[resumed]]"), "{text}");
    text.push_str("lr = 0.01\n");
    std::fs::write(&config, &text).unwrap();
    let out = localsgd(&[
        "train",
        "--config",
        config.to_str().unwrap(),
        "--run-dir",
        run_dir,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("a line written below the history lands in that table"),
        "{stderr}"
    );
}

/// A run directory an earlier version wrote: no `keep-checkpoints` (that version kept every
/// checkpoint, and so does its resume) and a value the run did not use (counted as unset).
#[test]
fn a_run_directory_of_an_earlier_version_resumes_as_it_went() {
    let (_dir, run) = scratch();
    let run_dir = run.to_str().unwrap();
    ok(&[
        "train",
        "--steps",
        "12",
        "--checkpoint-every",
        "2",
        "--keep-checkpoints",
        "0",
        "--run-dir",
        run_dir,
    ]);
    let config = run.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let old: String = text
        .lines()
        .filter(|l| !l.starts_with("keep-checkpoints"))
        .map(|l| match l.starts_with("d-model") {
            true => "d-model = 64\n".to_string(),
            false => format!("{l}\n"),
        })
        .collect();
    assert!(old.contains("d-model = 64") && !old.contains("keep-checkpoints"));
    std::fs::write(&config, old).unwrap();
    ok(&["train", "--resume", "--steps", "16", "--run-dir", run_dir]);
    let sealed = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("step-") && !name.ends_with(".tmp")
        })
        .count();
    assert_eq!(sealed, 8, "every checkpoint kept, 2 to 16");
    let saved = TrainConfig::from_toml_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    assert_eq!(saved.d_model, TrainConfig::default().d_model);
}

/// After a rank left (`on-rank-failure = "continue"`), a plain resume continues on the
/// survivors' number of workers; the report's start broadcast counts the first world's.
#[test]
fn a_run_that_lost_a_rank_resumes_on_the_survivors() {
    let (_dir, run) = scratch();
    let run_dir = run.to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args([
            "train",
            "--workers",
            "3",
            "--algorithm",
            "hierarchical",
            "--warmup",
            "2",
            "--levels",
            "2:1,4:3",
            "--steps",
            "12",
            "--checkpoint-every",
            "2",
            "--on-rank-failure",
            "continue",
            "--timeout-secs",
            "20",
            "--progress",
            "false",
            "--run-dir",
            run_dir,
        ])
        .env("LOCALSGD_FAULT", "panic@1:5")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert!(summary["start_bytes"].as_u64().unwrap() > 0, "{summary}");
    let out = ok(&[
        "train",
        "--resume",
        "--steps",
        "16",
        "--progress",
        "false",
        "--run-dir",
        run_dir,
    ]);
    assert!(out.contains("trained 16 iterations on 2 workers"), "{out}");
}

/// Data found by a relative path is saved as an absolute one: a resume from another directory
/// finds it; a moved data set is given again (recorded).
#[test]
fn a_relative_data_path_resumes_from_another_directory() {
    let dir = tempfile::tempdir().unwrap();
    let text = "abcdefghijklmnopqrstuvwxyz ".repeat(200);
    std::fs::write(dir.path().join("t.txt"), &text).unwrap();
    let run = dir.path().join("run");
    let run_dir = run.to_str().unwrap();
    let small = [
        "--model",
        "gpt",
        "--dataset",
        "text",
        "--context",
        "8",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--layers",
        "1",
        "--progress",
        "false",
        "--run-dir",
        run_dir,
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .current_dir(dir.path())
        .args(["train", "--text-file", "t.txt", "--steps", "4"])
        .args(small)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(&["train", "--resume", "--steps", "6", "--run-dir", run_dir]);
    let moved = dir.path().join("moved.txt");
    std::fs::rename(dir.path().join("t.txt"), &moved).unwrap();
    ok(&[
        "train",
        "--resume",
        "--steps",
        "8",
        "--text-file",
        moved.to_str().unwrap(),
        "--run-dir",
        run_dir,
    ]);
    let (_, history) =
        split_history(&std::fs::read_to_string(run.join("config.toml")).unwrap()).unwrap();
    let last = history.last().unwrap();
    assert!(
        last["settings"]["text-file"]
            .as_str()
            .unwrap()
            .ends_with("moved.txt"),
        "{last}"
    );
}
