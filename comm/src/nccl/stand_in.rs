//! Test support, not for production use: builds the CPU stand-ins for `libcuda.so.1` and
//! `libnccl.so.2` (`comm/tests/stand_in/*.c`, compiled with the system C compiler) that let this
//! backend's own logic run end to end on a machine without a GPU, and points a child process at
//! them. Used by this crate's `nccl_stand_in` tests and the trainer's `nccl_train` tests. The
//! stand-ins say nothing about real GPUs or real NCCL.

use std::path::Path;
use std::process::Command;

const CUDA_C: &str = include_str!("../../tests/stand_in/cuda.c");
const NCCL_C: &str = include_str!("../../tests/stand_in/nccl.c");
const HEADER: &str = include_str!("../../tests/stand_in/stand_in.h");

/// Build the stand-ins into `dir` (created, and emptied first): `libcuda.so.1`, a copy named
/// `libcuda.so` (the names cudarc and this crate's probe try), `libnccl.so.2` (without
/// `ncclCommSplit` when `with_split` is false, like NCCL before 2.18), and an empty
/// `exchange/` directory for the ranks' data. Runs `cc`.
pub fn build(dir: &Path, with_split: bool) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(dir);
    let src = dir.join("src");
    std::fs::create_dir_all(dir.join("exchange"))
        .and_then(|_| std::fs::create_dir_all(&src))
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for (name, text) in [
        ("cuda.c", CUDA_C),
        ("nccl.c", NCCL_C),
        ("stand_in.h", HEADER),
    ] {
        std::fs::write(src.join(name), text)
            .map_err(|e| format!("writing {}: {e}", src.join(name).display()))?;
    }
    let split: &[&str] = if with_split { &[] } else { &["-DNO_SPLIT"] };
    compile(&src.join("cuda.c"), &dir.join("libcuda.so.1"), &[])?;
    compile(&src.join("nccl.c"), &dir.join("libnccl.so.2"), split)?;
    std::fs::copy(dir.join("libcuda.so.1"), dir.join("libcuda.so"))
        .map_err(|e| format!("copying libcuda.so.1: {e}"))?;
    Ok(())
}

fn compile(src: &Path, out: &Path, defines: &[&str]) -> Result<(), String> {
    let result = Command::new("cc")
        .args(["-shared", "-fPIC", "-pthread", "-O1", "-std=gnu11"])
        .args(defines)
        .arg("-o")
        .arg(out)
        .arg(src)
        .arg("-lm")
        .output()
        .map_err(|e| format!("running cc (the C compiler Rust links with): {e}"))?;
    if result.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cc {} failed: {}",
            src.display(),
            String::from_utf8_lossy(&result.stderr)
        ))
    }
}

/// Make `cmd` load the stand-ins built in `dir` (first on `LD_LIBRARY_PATH`, which the dynamic
/// loader reads only at start-up, hence a child process), report `gpus` devices, run burn on
/// one thread, and ignore any rank or library settings inherited from this process.
pub fn configure(cmd: &mut Command, dir: &Path, gpus: usize) {
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.display()),
        _ => dir.display().to_string(),
    };
    cmd.env("LD_LIBRARY_PATH", path)
        .env("STAND_IN_NCCL_DIR", dir.join("exchange"))
        .env("STAND_IN_GPUS", gpus.to_string())
        .env("RAYON_NUM_THREADS", "1")
        .env_remove("LOCALSGD_NCCL_LIB")
        .env_remove("LOCALSGD_RANK")
        .env_remove("RANK");
}
