//! No setting is silently ignored: a value (other than the default) for a setting this run
//! would not use is refused, naming the setting and the model, data set, algorithm, schedule
//! or optimizer that does not use it; so are rehearsed faults that could never fire, and the
//! unclear cases get messages that say what to do. Nothing is written before.

use std::path::Path;
use std::process::{Command, Output};

fn localsgd(args: &[&str], fault: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_localsgd"));
    cmd.args(args).env_remove("LOCALSGD_FAULT");
    if let Some(f) = fault {
        cmd.env("LOCALSGD_FAULT", f);
    }
    cmd.output().unwrap()
}

fn refused(args: &[&str], fault: Option<&str>, expected: &[&str], run: &Path) {
    let out = localsgd(args, fault);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} ({fault:?}) was not refused: {stderr}"
    );
    for e in expected {
        assert!(stderr.contains(e), "{args:?} ({fault:?}): {stderr}");
    }
    assert!(!run.exists(), "{args:?} wrote the run directory");
}

#[test]
fn settings_the_run_would_not_use_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let text = dir.path().join("text.txt");
    std::fs::write(
        &text,
        "a few words of text, long enough for a tiny context\n".repeat(40),
    )
    .unwrap();
    let (r, t) = (run.to_str().unwrap(), text.to_str().unwrap());
    let gpt = ["--model", "gpt", "--dataset", "text", "--text-file", t];
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            vec!["--text-file", t],
            &[
                "invalid setting `text-file`",
                "only `dataset` = text uses it",
                "this run's `dataset` is digits",
            ],
        ),
        (
            [&gpt[..], &["--hidden", "999"]].concat(),
            &[
                "invalid setting `hidden` = [999]",
                "only `model` = mlp uses it",
                "this run's `model` is gpt",
            ],
        ),
        (
            vec!["--d-model", "64"],
            &[
                "invalid setting `d-model` = 64",
                "only `model` = gpt uses it",
                "this run's `model` is mlp",
            ],
        ),
        (
            vec!["--heads", "2"],
            &["invalid setting `heads` = 2", "this run's `model` is mlp"],
        ),
        (
            vec!["--model", "cnn", "--hidden", "32"],
            &[
                "invalid setting `hidden` = [32]",
                "this run's `model` is cnn",
            ],
        ),
        (
            vec!["--channels", "4"],
            &[
                "invalid setting `channels` = [4]",
                "only `model` = cnn uses it",
            ],
        ),
        (
            vec!["--algorithm", "ddp", "--warmup", "7"],
            &[
                "invalid setting `warmup` = 7",
                "`algorithm` = ddp",
                "has no warmup",
            ],
        ),
        (
            vec!["--lr-min", "0.01"],
            &[
                "invalid setting `lr-min` = 0.01",
                "`lr-schedule` = cosine",
                "constant",
            ],
        ),
        (
            vec!["--lr-gamma", "0.5", "--lr-schedule", "cosine"],
            &["invalid setting `lr-gamma` = 0.5", "`lr-schedule` = step"],
        ),
        (
            vec!["--lr-warmup-steps", "3"],
            &["invalid setting `lr-warmup-steps` = 3", "linear-warmup"],
        ),
        (
            vec!["--synthetic-dim", "8"],
            &[
                "invalid setting `synthetic-dim` = 8",
                "only `dataset` = synthetic uses it",
            ],
        ),
        (
            vec!["--data-dir", "/tmp"],
            &[
                "invalid setting `data-dir` = /tmp",
                "only `dataset` = idx uses it",
            ],
        ),
        (
            vec!["--optimizer", "adam", "--momentum", "0.5"],
            &[
                "invalid setting `momentum` = 0.5",
                "this run's `optimizer` is adam",
            ],
        ),
        (
            vec!["--optimizer", "sgd", "--weight-decay-matrices-only", "true"],
            &[
                "invalid setting `weight-decay-matrices-only` = true",
                "this run's `optimizer` is sgd",
            ],
        ),
        (
            vec!["--steps", "10", "--epochs", "3"],
            &["invalid setting `epochs` = 3", "`steps` = 10 ends the run"],
        ),
        (
            vec!["--algorithm", "local-sgd", "--bucket-cap-mb", "5"],
            &[
                "invalid setting `bucket-cap-mb` = 5",
                "local-sgd sends no gradients",
            ],
        ),
        (
            vec!["--algorithm", "local-sgd", "--pipeline-buckets", "off"],
            &["invalid setting `pipeline-buckets` = off"],
        ),
        (
            vec!["--accumulation", "epoch-end"],
            &[
                "invalid setting `accumulation` = epoch-end",
                "`accumulate` = 1",
            ],
        ),
        (
            vec![
                "--on-rank-failure",
                "continue",
                "--workers",
                "1",
                "--checkpoint-every",
                "5",
            ],
            &[
                "invalid setting `on-rank-failure` = continue",
                "with one worker",
            ],
        ),
        (
            vec![
                "--on-rank-failure",
                "replace",
                "--workers",
                "1",
                "--checkpoint-every",
                "5",
            ],
            &[
                "invalid setting `on-rank-failure` = replace",
                "with one worker",
            ],
        ),
        // burn's flush mode reaches only its own CPU threads.
        (
            vec!["--device", "cuda", "--flush-denormals", "true"],
            &[
                "invalid setting `flush-denormals` = true",
                "`false` with device `cuda`",
                "only `cpu` computes on",
            ],
        ),
    ];
    // A LibTorch device in a binary built without it names the feature and how to build it.
    #[cfg(not(feature = "libtorch"))]
    let cases = [
        cases,
        vec![(
            vec!["--device", "libtorch"],
            &[
                "invalid setting `device` = libtorch",
                "built without LibTorch",
                "--features libtorch",
            ][..],
        )],
    ]
    .concat();
    for (extra, expected) in cases {
        let mut args = vec!["train", "--progress", "false", "--run-dir", r];
        args.extend(extra);
        refused(&args, None, expected, &run);
    }
    // Defaults given explicitly are what the run would do anyway: accepted.
    let out = localsgd(
        &[
            "train",
            "--steps",
            "3",
            "--d-model",
            "128",
            "--lr-min",
            "0",
            "--run-dir",
            r,
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A rehearsed fault that cannot fire in this run is refused: a rank outside the world, an
/// iteration at or past the end, a checkpoint the run does not write. `checkpoint@R:I` names
/// the checkpoint of I iterations.
#[test]
fn faults_that_could_never_fire_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let r = run.to_str().unwrap();
    let args = [
        "train",
        "--workers",
        "2",
        "--steps",
        "100",
        "--checkpoint-every",
        "20",
        "--progress",
        "false",
        "--run-dir",
        r,
    ];
    refused(
        &args,
        Some("panic@2:5"),
        &["LOCALSGD_FAULT: panic@2:5 can never fire", "2 worker(s)"],
        &run,
    );
    refused(
        &args,
        Some("panic@1:100"),
        &[
            "panic@1:100 can never fire",
            "the 0-based iterations 0..100",
        ],
        &run,
    );
    refused(
        &args,
        Some("checkpoint@1:99"),
        &[
            "checkpoint@1:99 can never fire",
            "multiples of `checkpoint-every` = 20",
            "up to 100",
        ],
        &run,
    );
    refused(
        &args,
        Some("checkpoint@1:120"),
        &["checkpoint@1:120 can never fire"],
        &run,
    );
    let no_checkpoints = [
        "train",
        "--steps",
        "10",
        "--progress",
        "false",
        "--run-dir",
        r,
    ];
    refused(
        &no_checkpoints,
        Some("checkpoint@0:10"),
        &["writes no checkpoint during training"],
        &run,
    );
    // The checkpoint of 100 iterations (the run's last) fires: rank 1 fails in it (abort).
    let out = localsgd(&args, Some("checkpoint@1:100"));
    assert!(!out.status.success());
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(
        latest, "step-00000080",
        "the failure came before the checkpoint of 100 was published"
    );
    assert!(run.join("checkpoints/step-00000100/rank-1.ckpt").exists());
}

/// Unclear cases get messages that say what to do: a pipe as the text, a bare word in TOML.
#[test]
fn a_pipe_as_text_and_an_unquoted_toml_word_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let r = run.to_str().unwrap();
    let fifo = dir.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    refused(
        &[
            "train",
            "--model",
            "gpt",
            "--dataset",
            "text",
            "--text-file",
            fifo.to_str().unwrap(),
            "--run-dir",
            r,
        ],
        None,
        &[
            "invalid setting `text-file`",
            "a regular file of text",
            "a pipe",
            "save the text to a file first",
        ],
        &run,
    );
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        "algorithm = \"diloco\"\naverage-compression = int4\n",
    )
    .unwrap();
    refused(
        &[
            "train",
            "--config",
            config.to_str().unwrap(),
            "--run-dir",
            r,
        ],
        None,
        &["hint: a text value needs quotes in TOML: average-compression = \"int4\""],
        &run,
    );
    // A boolean is not quoted; a number gets no text hint.
    let with_file = |text: &str| {
        std::fs::write(&config, text).unwrap();
        localsgd(
            &[
                "train",
                "--config",
                config.to_str().unwrap(),
                "--run-dir",
                r,
            ],
            None,
        )
    };
    let out = with_file("shuffle = False\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("hint: `shuffle` is written in lowercase: shuffle = false"),
        "{stderr}"
    );
    let out = with_file("period = four\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("hint:"),
        "{stderr}"
    );
    assert!(!run.exists());
}
