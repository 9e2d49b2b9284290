//! What the machine allows: the memory a run's data and models need, checked against the memory
//! available before anything is allocated, so an oversized setting is an error that names it
//! and the limit, never an allocator abort.
//!
//! The estimates are lower bounds (only the buffers a run cannot do without), so a refusal
//! means the run could not have fit; a run that passes may still need more.
//!
//! ```
//! use localsgd_models::limits::{Need, check};
//! // 1 KiB against 2 KiB available: fine; against 512 bytes: refused, naming the setting.
//! assert!(check(&Need::new("hidden", "64", "the models", 1024), Some(2048)).is_ok());
//! let e = check(&Need::new("hidden", "64", "the models", 1024), Some(512)).unwrap_err();
//! assert!(e.to_string().starts_with("invalid setting `hidden` = 64"));
//! ```

/// A setting whose memory need exceeds what the machine has available.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "invalid setting `{setting}` = {value}: {what} need at least {} but this machine has {} available; {hint}",
    human(*need),
    human(*available)
)]
pub struct TooLarge {
    /// The setting (or settings) at fault, as in the configuration file.
    pub setting: String,
    /// Its value as given.
    pub value: String,
    /// What needs the memory.
    pub what: String,
    /// Bytes needed, at least.
    pub need: u64,
    /// Bytes available.
    pub available: u64,
    /// What to change.
    pub hint: String,
}

/// A memory need: which setting drives it and how many bytes it takes at least.
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    setting: String,
    value: String,
    what: String,
    bytes: u64,
    hint: String,
}

impl Need {
    /// `bytes` needed by `what`, driven by `setting` = `value`.
    pub fn new(setting: &str, value: &str, what: &str, bytes: u64) -> Self {
        Self {
            setting: setting.into(),
            value: value.into(),
            what: what.into(),
            bytes,
            hint: format!("use a smaller `{setting}`"),
        }
    }

    /// Replace the default hint ("use a smaller `setting`").
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = hint.into();
        self
    }
}

/// Refuse `need` when it exceeds `available` bytes (`None`: unknown, nothing is refused).
pub fn check(need: &Need, available: Option<u64>) -> Result<(), TooLarge> {
    match available {
        Some(available) if need.bytes > available => Err(TooLarge {
            setting: need.setting.clone(),
            value: need.value.clone(),
            what: need.what.clone(),
            need: need.bytes,
            available,
            hint: need.hint.clone(),
        }),
        _ => Ok(()),
    }
}

/// Bytes this process can still allocate: `MemAvailable` of `/proc/meminfo`, capped by the
/// cgroup's limit less its usage (`memory.max`, `memory.current` less the reclaimable
/// `inactive_file` of `memory.stat`; a container's share). `None` where neither can be read
/// (not Linux).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb.saturating_mul(1024))
        });
    let read = |name: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{name}"))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    // The cgroup's usage counts page cache the kernel reclaims on demand (`inactive_file`).
    let reclaimable = std::fs::read_to_string("/sys/fs/cgroup/memory.stat")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("inactive_file "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    let used = read("memory.current")
        .unwrap_or(0)
        .saturating_sub(reclaimable);
    let cgroup = read("memory.max").map(|max| max.saturating_sub(used));
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `n` bytes as "1.5 GB" (decimal units, as `free -h --si`).
pub fn human(n: u64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < units.len() {
        v /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_only_beyond_what_is_available() {
        let need = Need::new(
            "synthetic-samples",
            "10000000000",
            "the synthetic data",
            4_000_000_000_000,
        );
        assert!(check(&need, None).is_ok());
        assert!(check(&need, Some(4_000_000_000_000)).is_ok());
        let e = check(&need, Some(24_000_000_000)).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid setting `synthetic-samples` = 10000000000: the synthetic data need at least 4.0 TB but this machine has 24.0 GB available; use a smaller `synthetic-samples`"
        );
    }

    #[test]
    fn this_machine_reports_some_memory() {
        if cfg!(target_os = "linux") {
            assert!(available_memory().is_some_and(|b| b > 0));
        }
    }

    #[test]
    fn human_units() {
        assert_eq!(human(999), "999 B");
        assert_eq!(human(1_500), "1.5 kB");
        assert_eq!(human(25_600_000_000), "25.6 GB");
        assert_eq!(human(u64::MAX), "18.4 EB");
    }
}
