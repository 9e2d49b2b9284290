//! Model export (`localsgd train --export`, `localsgd export`): the file holds the model whose
//! accuracy `summary.json` reports (read back through the PyTorch-layout loader, and through
//! PyTorch itself where torch is installed), the two commands write the same bytes, a pending
//! overlapped average is applied, and bad input is refused before anything is written.

use crate::cli::{localsgd, ok};
use burn::tensor::Device;
use localsgd_models::cnn::CnnConfig;
use localsgd_models::mlp::MlpConfig;
use localsgd_models::network::{ModelSpec, ModelSpec as Spec};
use localsgd_models::pytorch::load_pytorch_safetensors;
use localsgd_pipeline::checkpoint::CheckpointDir;
use localsgd_trainer::run::evaluate;
use std::path::Path;
use std::process::{Command, Output};

fn failed(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

/// Whether two files hold the same bytes (without printing them when not).
fn same_bytes(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

/// Losses equal up to the last bits: burn's matmul may split its sums differently with the
/// number of threads running, so the logits of the same model can differ in the last bit.
fn close(ours: f64, summary: f64) {
    assert!(
        (ours - summary).abs() <= 1e-9 * summary.abs(),
        "loss {ours} vs summary.json's {summary}"
    );
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Train 4 thread ranks of overlapped post-local SGD that stop with an average in flight,
/// exporting `export_rank` (or the world average).
fn train(run: &Path, file: &Path, model: &[&str], export_rank: Option<&str>) -> String {
    let mut args = vec![
        "train",
        "--workers",
        "4",
        "--algorithm",
        "post-local-sgd",
        "--warmup",
        "8",
        "--period",
        "4",
        "--overlap",
        "3",
        "--steps",
        "26",
        "--batch-size",
        "16",
        "--lr",
        "0.1",
        "--progress",
        "false",
        "--run-dir",
        s(run),
        "--export",
        s(file),
    ];
    args.extend_from_slice(model);
    if let Some(r) = export_rank {
        args.extend_from_slice(&["--export-rank", r]);
    }
    ok(&localsgd(&args))
}

/// The test accuracy and loss of the exported file, read back with the PyTorch-layout loader.
fn evaluate_file(file: &Path, spec: &ModelSpec) -> (f64, f64) {
    let device = Device::flex();
    let data = localsgd_models::data::digits::load().unwrap();
    let model = load_pytorch_safetensors(file, spec, &device).unwrap();
    let e = evaluate(&model, &data.test, &device).unwrap();
    (e.accuracy, e.loss)
}

fn mlp() -> ModelSpec {
    Spec::Mlp(MlpConfig {
        input: 64,
        hidden: vec![32],
        classes: 10,
    })
}

#[test]
fn the_exported_world_average_is_the_model_the_summary_reports() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let exported = dir.path().join("world.safetensors");
    let stdout = train(&run, &exported, &["--hidden", "32"], None);
    assert!(
        stdout.contains("exported the world-averaged model to"),
        "{stdout}"
    );
    // The run stopped with an overlapped average in flight (started at step 24, due at 27).
    let ckpt = CheckpointDir::new(&run);
    let (_, identity) = ckpt.latest_identity().unwrap();
    let pending = ckpt.load_rank(2, &identity).unwrap().pending_average();
    assert_eq!(pending.map(|p| p.started_at), Some(24));

    let sum = summary(&run);
    let (accuracy, loss) = evaluate_file(&exported, &mlp());
    assert_eq!(accuracy, sum["test_accuracy"].as_f64().unwrap());
    close(loss, sum["test_loss"].as_f64().unwrap());

    // `localsgd export` reads the checkpoint (applying the pending average) to the same bytes.
    let offline = dir.path().join("offline.safetensors");
    let out = ok(&localsgd(&["export", s(&run), s(&offline)]));
    assert!(
        out.contains("exported the world-averaged model of 4 ranks after 26 iterations"),
        "{out}"
    );
    assert!(
        same_bytes(&exported, &offline),
        "{} and {} differ",
        exported.display(),
        offline.display()
    );

    // Rank 3's own model, both ways; it is the model of summary.json's ranks[3].
    let rank_file = dir.path().join("rank3.safetensors");
    ok(&localsgd(&[
        "export",
        s(&run),
        s(&rank_file),
        "--rank",
        "3",
    ]));
    let (accuracy3, loss3) = evaluate_file(&rank_file, &mlp());
    assert_eq!(
        accuracy3,
        sum["ranks"][3]["test_accuracy"].as_f64().unwrap()
    );
    close(loss3, sum["ranks"][3]["test_loss"].as_f64().unwrap());
    assert!(
        !same_bytes(&rank_file, &exported),
        "after local steps a rank's own model differs from the average"
    );
    let run2 = dir.path().join("run2");
    let in_run = dir.path().join("rank3-in-run.safetensors");
    train(&run2, &in_run, &["--hidden", "32"], Some("3"));
    assert!(
        same_bytes(&rank_file, &in_run),
        "{} and {} differ",
        rank_file.display(),
        in_run.display()
    );

    pytorch_check(&exported, &["--hidden", "32"], accuracy);
}

#[test]
fn a_cnn_exports_its_batch_norm_statistics_both_ways_alike() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let exported = dir.path().join("cnn.safetensors");
    train(
        &run,
        &exported,
        &["--model", "cnn", "--channels", "4,8"],
        None,
    );
    let offline = dir.path().join("offline.safetensors");
    ok(&localsgd(&["export", s(&run), s(&offline)]));
    assert!(
        same_bytes(&exported, &offline),
        "{} and {} differ",
        exported.display(),
        offline.display()
    );
    let spec = Spec::Cnn(CnnConfig::for_features(64, vec![4, 8], 10).unwrap());
    let (accuracy, loss) = evaluate_file(&exported, &spec);
    let sum = summary(&run);
    assert_eq!(accuracy, sum["test_accuracy"].as_f64().unwrap());
    close(loss, sum["test_loss"].as_f64().unwrap());
    pytorch_check(
        &exported,
        &["--model", "cnn", "--channels", "4,8"],
        accuracy,
    );
}

/// Where torch is installed: PyTorch loads the file with `load_state_dict(strict=True)` and
/// scores the test split within one sample of ours (float summation order may flip a near
/// tie). Elsewhere it says it skipped.
fn pytorch_check(file: &Path, model: &[&str], ours: f64) {
    let has_torch = Command::new("python3")
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_torch {
        eprintln!("skipping the PyTorch check: python3 with torch is not installed");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/check_export.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(file)
        .args(model)
        .output()
        .unwrap();
    let stdout = ok(&out);
    let line = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    let samples = v["samples"].as_f64().unwrap();
    let correct = v["correct"].as_f64().unwrap();
    assert!(
        (correct - ours * samples).abs() <= 1.0,
        "PyTorch scores {correct}/{samples}, we {}",
        ours * samples
    );
}

#[test]
fn bad_export_input_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let missing_dir = dir.path().join("no/such/dir/model.safetensors");
    let base = ["train", "--steps", "4", "--progress", "false", "--run-dir"];
    let err = failed(&localsgd(
        &[&base[..], &[s(&run), "--export", s(&missing_dir)]].concat(),
    ));
    assert!(
        err.contains("invalid setting `export`") && err.contains("existing directory"),
        "{err}"
    );
    let err = failed(&localsgd(
        &[&base[..], &[s(&run), "--export-rank", "1"]].concat(),
    ));
    assert!(
        err.contains("invalid setting `export-rank` = 1") && err.contains("together with `export`"),
        "{err}"
    );
    let file = dir.path().join("m.safetensors");
    let err = failed(&localsgd(
        &[
            &base[..],
            &[s(&run), "--export", s(&file), "--export-rank", "2"],
        ]
        .concat(),
    ));
    assert!(
        err.contains("`export-rank` = 2") && err.contains("below `workers` = 2"),
        "{err}"
    );
    assert!(!run.exists(), "a refused run wrote its directory");

    // `localsgd export` on something that is not a run, and with a rank the run lacks.
    let err = failed(&localsgd(&["export", s(dir.path()), s(&file)]));
    assert!(
        err.contains("config.toml") && err.contains("not found"),
        "{err}"
    );
    ok(&localsgd(&[&base[..], &[s(&run)]].concat()));
    let err = failed(&localsgd(&["export", s(&run), s(&file), "--rank", "5"]));
    assert!(
        err.contains("invalid rank 5: the run has 2 ranks, 0 to 1"),
        "{err}"
    );
    assert!(!file.exists(), "a refused export wrote its file");
}
