//! burn's LibTorch backend (trainer feature `libtorch`) end to end through the binary: the bare
//! step on `device = "libtorch"` and the refusal of `libtorch-cuda` where LibTorch sees no GPU.
//! That training on it matches PyTorch's numbers is `pytorch_reference`'s
//! `losses_match_pytorch_on_libtorch`.
#![cfg(feature = "libtorch")]

use std::process::Command;

#[test]
fn bench_step_runs_the_gpt_on_libtorch() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("step.json");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args([
            "bench-step",
            "--device",
            "libtorch",
            "--model",
            "gpt",
            "--dataset",
            "text",
            "--text-file",
            "data/text/localsgd-docs.txt",
            "--optimizer",
            "adamw",
            "--lr",
            "0.001",
            "--batch-size",
            "4",
            "--iters",
            "3",
            "--warmup-iters",
            "1",
            "--workers",
            "1",
            "--json",
        ])
        .arg(&json)
        .current_dir(&root)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("device libtorch"), "{stdout}");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(result["device"], "libtorch");
    assert_eq!(result["params"], 470_784, "the default GPT's size");
    assert_eq!(result["omp_num_threads"], "1");
    let loss = result["last_loss"].as_f64().unwrap();
    // Four AdamW steps at lr 1e-3 from the initial weights: below ln(256) = 5.55 nats per byte
    // (uniform over bytes), far from where English text ends (about 1.5).
    assert!(loss > 3.5 && loss < 5.55, "last loss {loss}");
}

#[test]
fn libtorch_cuda_needs_a_gpu_per_rank() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_localsgd"))
        .args(["train", "--device", "libtorch-cuda", "--steps", "2"])
        .args([
            "--progress",
            "false",
            "--checkpoint-every",
            "0",
            "--run-dir",
        ])
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        // A machine whose PyTorch sees two GPUs trains on them.
        return;
    }
    assert!(
        stderr.contains("`libtorch-cuda`: rank") && stderr.contains("LibTorch sees"),
        "{stderr}"
    );
}
