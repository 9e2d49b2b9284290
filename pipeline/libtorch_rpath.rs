// LibTorch's rpath with the feature `libtorch`, for the build scripts of the pipeline, trainer
// and learner crates (`include!`d by each; pipeline/build.rs says what it does).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    for var in ["LIBTORCH", "LIBTORCH_LIB", "LIBTORCH_USE_PYTORCH", "VIRTUAL_ENV"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_LIBTORCH").is_none() {
        return;
    }
    if let Some(dir) = libtorch_lib_dir() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
}

/// LibTorch's library folder, found as `torch-sys` finds it; `None` where it cannot be told
/// (torch-sys then fails with its own message, or downloaded LibTorch itself).
fn libtorch_lib_dir() -> Option<PathBuf> {
    if std::env::var_os("LIBTORCH_USE_PYTORCH").is_some() {
        // The interpreter torch-sys runs: `python` inside a virtual environment, else `python3`.
        let python = if std::env::var_os("VIRTUAL_ENV").is_some() {
            "python"
        } else {
            "python3"
        };
        let out = Command::new(python)
            .args([
                "-c",
                "from torch.utils import cpp_extension; print(cpp_extension.library_paths()[0])",
            ])
            .output()
            .ok()?;
        let path = String::from_utf8(out.stdout).ok()?;
        let path = path.trim();
        return (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path));
    }
    std::env::var_os("LIBTORCH_LIB")
        .or_else(|| std::env::var_os("LIBTORCH"))
        .map(|dir| PathBuf::from(dir).join("lib"))
}
