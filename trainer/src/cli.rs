//! The command-line side of the settings: how flags, the config file and the defaults combine ([`ConfigFlags::resolve`]: a flag overrides the file,
//! which overrides the defaults). The flags themselves are declared with the settings, in
//! [`crate::config`].

use crate::config::{ConfigFlags, TrainConfig};

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

    /// The settings of this invocation: defaults, then the config file, then the flags; with
    /// `resume`, the run directory's own `config.toml` instead of the defaults (less the
    /// settings that say what this invocation does: [`rule`](crate::resume::rule)), so that a
    /// resumed run keeps every setting not given again. Whether the given ones may change is
    /// [`ResumePlan::check`](crate::resume::ResumePlan::check)'s to say.
    pub fn resolve(&self) -> Result<TrainConfig, String> {
        let file = self.file_settings()?;
        let mut cfg = TrainConfig::from_table(file.clone().unwrap_or_default())
            .map_err(|e| self.in_file(e))?;
        self.overlay(&mut cfg);
        if !cfg.resume {
            return Ok(cfg);
        }
        let saved = crate::resume::RunSettings::read(&cfg.run_dir).map_err(|e| e.to_string())?;
        let mut table = saved.inherited();
        // The run's length is `steps` when set, else `epochs`: a length given now in one of
        // them replaces the run's in the other (`--resume --epochs 40` on a run of `steps`
        // trains to 40 epochs).
        let file = file.unwrap_or_default();
        // Given now: as a flag, or in the file with another value than the run's (a file that
        // repeats the run's settings gives nothing new).
        let given = |key: &str| {
            file.get(key)
                .is_some_and(|v| saved.settings.get(key) != Some(v))
        };
        if (self.epochs.is_some() || given("epochs")) && self.steps.is_none() && !given("steps") {
            table.remove("steps");
        }
        if (self.steps.is_some() || given("steps")) && self.epochs.is_none() && !given("epochs") {
            table.remove("epochs");
        }
        table.extend(file);
        let mut resumed = TrainConfig::from_table(table).map_err(|e| self.in_file(e))?;
        self.overlay(&mut resumed);
        Ok(resumed)
    }

    /// The settings of this invocation without a run's own (`localsgd compare`, which trains
    /// fresh runs): defaults, then the config file, then the flags.
    pub fn resolve_fresh(&self) -> Result<TrainConfig, String> {
        let mut cfg = TrainConfig::from_table(self.file_settings()?.unwrap_or_default())
            .map_err(|e| self.in_file(e))?;
        self.overlay(&mut cfg);
        Ok(cfg)
    }

    /// The config file's settings (`None` without `--config`).
    fn file_settings(&self) -> Result<Option<toml::Table>, String> {
        let Some(path) = &self.config else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        // Through the parser of settings, for its messages (a bare word's quote hint), then as
        // a table, without a run file's `[[resumed]]` history.
        TrainConfig::from_toml_str(&text).map_err(|e| self.in_file(e))?;
        let (settings, _history) =
            crate::history::split_history(&text).map_err(|e| self.in_file(e))?;
        Ok(Some(settings))
    }

    /// An error about the config file's settings, naming the file.
    fn in_file(&self, error: String) -> String {
        match &self.config {
            Some(path) => format!("config file {}: {error}", path.display()),
            None => error,
        }
    }
}
