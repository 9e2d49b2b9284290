//! The command-line side of the settings: list flags' syntax ([`Widths`]) and how flags, the
//! config file and the defaults combine ([`ConfigFlags::resolve`]: a flag overrides the file,
//! which overrides the defaults). The flags themselves are declared with the settings, in
//! [`crate::config`].

use crate::config::{ConfigFlags, TrainConfig};

/// Layer widths as given on the command line: comma-separated, `""` for none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Widths(pub Vec<usize>);

impl From<Widths> for Vec<usize> {
    fn from(w: Widths) -> Self {
        w.0
    }
}

/// Parse `128,64` (spaces allowed around the commas) or `""` (no layers) into [`Widths`].
pub fn parse_widths(s: &str) -> Result<Widths, String> {
    parse_list(
        s,
        "a width: expected comma-separated non-negative integers, e.g. 128,64, or \"\" for no hidden layer",
    )
}

/// Parse a comma-separated list of saved ranks (`0,2,3`) for `--resume-ranks`; `""` for
/// none.
pub fn parse_ranks(s: &str) -> Result<Widths, String> {
    parse_list(
        s,
        "a rank: expected the saved ranks each worker continues from, comma-separated non-negative integers, e.g. 0,2,3",
    )
}

/// Comma-separated non-negative integers (`""`: none); a bad entry is "`part` is not `what`".
fn parse_list(s: &str, what: &str) -> Result<Widths, String> {
    if s.trim().is_empty() {
        return Ok(Widths(Vec::new()));
    }
    s.split(',')
        .map(|part| {
            part.trim()
                .parse::<usize>()
                .map_err(|_| format!("{part:?} is not {what}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Widths)
}

impl ConfigFlags {
    /// Whether `workers` was given explicitly (as a flag or in the config file). Under MPI an
    /// unset `workers` means "the MPI world size"; a given one must match it.
    pub fn workers_given(&self) -> Result<bool, String> {
        if self.workers.is_some() {
            return Ok(true);
        }
        let Some(path) = &self.config else {
            return Ok(false);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        let table: toml::Table =
            toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))?;
        Ok(table.contains_key("workers"))
    }

    /// Defaults, then the config file, then the flags.
    pub fn resolve(&self) -> Result<TrainConfig, String> {
        let mut cfg = match &self.config {
            Some(path) => TrainConfig::from_toml_file(path)?,
            None => TrainConfig::default(),
        };
        self.overlay(&mut cfg);
        Ok(cfg)
    }
}
