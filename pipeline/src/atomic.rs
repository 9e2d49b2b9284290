//! Files written whole or not at all: a killed run leaves either the previous file or the new
//! one, never a torn one. The workspace's one writer of run files (the binary's reports, plots
//! and metrics, the models' weights files, the learner's state) and the primitives the
//! checkpoints' staging directories are written with ([`write_synced`], [`sync_dir`]).
//!
//! ```
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("summary.json");
//! localsgd_pipeline::atomic::write_atomic(&path, b"{}\n")?;
//! assert_eq!(std::fs::read(&path)?, b"{}\n");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The temporary sibling `path` is written to before the rename: `.NAME.tmp` in the same
/// directory (a rename is atomic only within one file system).
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp"))
}

/// Write `bytes` to `path` atomically: into a temporary file in the same directory, synced,
/// then renamed over `path`, and the directory synced (so the rename itself survives a power
/// cut where the file system allows it).
///
/// A target that exists and is not a regular file (`/dev/stdout`, a FIFO, a symbolic link) is
/// written in place instead: renaming over it would replace the device or the link.
pub fn write_atomic(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    if fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file()) {
        return fs::write(path, bytes);
    }
    let tmp = temp_path(path);
    let result = write_synced(&tmp, bytes).and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        // Nothing half-written is left behind; the original error is the one to report.
        let _ = fs::remove_file(&tmp);
    }
    result?;
    sync_parent(path);
    Ok(())
}

/// Write `bytes` to `path` (created or truncated) and sync the file: its contents are durable
/// once this returns, its name only once its directory is synced ([`sync_dir`]).
pub fn write_synced(path: &Path, bytes: impl AsRef<[u8]>) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    f.write_all(bytes.as_ref())?;
    f.sync_all()
}

/// Sync the directory `dir`: the names created, renamed or removed in it are durable once this
/// returns.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Sync the directory holding `path`, where the platform can (a rename is durable once its
/// directory is). Best effort: some file systems refuse to sync a directory.
fn sync_parent(path: &Path) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plot.svg");
        fs::write(&path, "old").unwrap();
        write_atomic(&path, "new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("plot.svg")]);
    }

    #[cfg(unix)]
    #[test]
    fn a_symbolic_link_is_written_through_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.json");
        let link = dir.path().join("link.json");
        fs::write(&target, "old").unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
        write_atomic(&link, "new").unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "new");
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("summary.json");
        assert!(write_atomic(&path, "x").is_err());
        assert!(!path.exists());
    }
}
