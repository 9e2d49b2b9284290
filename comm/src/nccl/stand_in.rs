//! Test support, not for production use: builds the CPU stand-ins for `libcuda.so.1` and
//! `libnccl.so.2` (`comm/tests/stand_in/*.c`, compiled with the system C compiler) that let this
//! backend's own logic run end to end on a machine without a GPU, and points a child process at
//! them. Used by this crate's `nccl_stand_in` tests and the trainer's `nccl_train` tests. The
//! stand-ins say nothing about real GPUs or real NCCL.

use std::path::{Path, PathBuf};
use std::process::Command;

const CUDA_C: &str = include_str!("../../tests/stand_in/cuda.c");
const NCCL_C: &str = include_str!("../../tests/stand_in/nccl.c");
const HEADER: &str = include_str!("../../tests/stand_in/stand_in.h");

/// Why the stand-ins could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StandInError {
    /// A file or directory could not be written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `cc` could not be run, or failed.
    #[error("cc {}: {message}", source_file.display())]
    Compiler {
        /// The C file.
        source_file: PathBuf,
        /// What went wrong (`cc`'s standard error when it ran).
        message: String,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StandInError {
    let path = path.to_path_buf();
    move |source| StandInError::Io { what, path, source }
}

/// Build the stand-ins into `dir` (created, and emptied first): `libcuda.so.1` (with that
/// soname), a link to it named `libcuda.so` (the names cudarc and this crate's probe try),
/// `libnccl.so.2` (without `ncclCommSplit` when `with_split` is false, like NCCL before 2.18),
/// and an empty `exchange/` directory for the ranks' data. Runs `cc`.
pub fn build(dir: &Path, with_split: bool) -> Result<(), StandInError> {
    let _ = std::fs::remove_dir_all(dir);
    let src = dir.join("src");
    std::fs::create_dir_all(&src).map_err(io("creating", &src))?;
    std::fs::create_dir_all(dir.join("exchange")).map_err(io("creating", dir))?;
    for (name, text) in [
        ("cuda.c", CUDA_C),
        ("nccl.c", NCCL_C),
        ("stand_in.h", HEADER),
    ] {
        std::fs::write(src.join(name), text).map_err(io("writing", &src.join(name)))?;
    }
    let cuda = dir.join("libcuda.so.1");
    compile(&src.join("cuda.c"), &cuda, &["-Wl,-soname,libcuda.so.1"])?;
    let split: &[&str] = if with_split { &[] } else { &["-DNO_SPLIT"] };
    compile(&src.join("nccl.c"), &dir.join("libnccl.so.2"), split)?;
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so"))
        .map_err(io("linking", &dir.join("libcuda.so")))?;
    Ok(())
}

/// Compile one C file into a shared library `out` (with `-pthread -lm -ldl` and `flags`).
pub fn compile(source_file: &Path, out: &Path, flags: &[&str]) -> Result<(), StandInError> {
    let result = Command::new("cc")
        .args(["-shared", "-fPIC", "-pthread", "-O1", "-std=gnu11"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(source_file)
        .args(["-lm", "-ldl"])
        .output()
        .map_err(|e| StandInError::Compiler {
            source_file: source_file.to_path_buf(),
            message: format!("cannot run cc (the C compiler Rust links with): {e}"),
        })?;
    if result.status.success() {
        Ok(())
    } else {
        Err(StandInError::Compiler {
            source_file: source_file.to_path_buf(),
            message: String::from_utf8_lossy(&result.stderr).into_owned(),
        })
    }
}

/// Make `cmd` load the stand-ins built in `dir` (first on `LD_LIBRARY_PATH`, which the dynamic
/// loader reads only at start-up, hence a child process), report `gpus` devices, run burn on
/// one thread, and drop every rank, world or library setting inherited from this process.
pub fn configure(cmd: &mut Command, dir: &Path, gpus: usize) {
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.display()),
        _ => dir.display().to_string(),
    };
    cmd.env("LD_LIBRARY_PATH", path)
        .env("STAND_IN_NCCL_DIR", dir.join("exchange"))
        .env("STAND_IN_GPUS", gpus.to_string())
        .env("RAYON_NUM_THREADS", "1");
    for name in [
        "NCCL_LIB",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        cmd.env_remove(format!("LOCALSGD_{name}")).env_remove(name);
    }
}
