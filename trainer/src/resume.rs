//! Resuming a run with its own settings: `localsgd train --resume` starts from the run
//! directory's `config.toml` and applies the settings given again on top of it
//! ([`ConfigFlags::resolve`](crate::config::ConfigFlags::resolve)). A setting the checkpoint
//! fixes (the model and its shape, the data set and its order, the optimizer, the algorithm and
//! its state, the seed) must keep its value; one that may change (the run's length, the
//! learning-rate schedule, checkpoint and log cadence, what a failure does, where and how the
//! ranks run) is applied and recorded in `config.toml` as a `[[resumed]]` table with the
//! iteration from which it holds. [`ResumePlan::check`] makes every check before anything in
//! the run directory is written.
//!
//! ```
//! use localsgd_trainer::config::TrainConfig;
//! use localsgd_trainer::resume::{SettingRule, rule};
//!
//! assert_eq!(rule("steps"), SettingRule::Changeable);
//! assert!(matches!(rule("optimizer"), SettingRule::Fixed(_)));
//! assert_eq!(rule("run-dir"), SettingRule::Invocation);
//! ```

use crate::config::{Levels, SETTINGS, TrainConfig};
use crate::history::{HISTORY_KEY, split_history};
use localsgd_pipeline::checkpoint::{CheckpointDir, CheckpointError};
use std::path::{Path, PathBuf};

/// How a setting may differ between a run and its resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingRule {
    /// Fixed by the checkpoint: a resume must keep the run's value. The text says what fixes
    /// it.
    Fixed(&'static str),
    /// May change on a resume: applied, and recorded with the iteration from which it holds.
    Changeable,
    /// Says what this invocation does (where the run is, whether it resumes, what it exports):
    /// taken from the invocation alone, never from the run's file.
    Invocation,
}

/// The rule of the setting `key` (its TOML name, kebab-case). `workers` is fixed unless
/// `resume-ranks` says how to continue on another number ([`ResumePlan::check`]).
pub fn rule(key: &str) -> SettingRule {
    const MODEL: &str = "the checkpoint holds the model's parameters in that shape";
    const DATA: &str = "the checkpoint's data position counts into that data set";
    const ORDER: &str = "the checkpoint's data position (epoch, batch) is in that data order";
    const SEED: &str = "the data order, the initial weights and stochastic rounding draw from it";
    const OPTIMIZER: &str =
        "the checkpoint holds that optimizer's state, and its step is part of the run";
    const ALGORITHM: &str =
        "the checkpoint holds that algorithm's state (averager, hook, outer optimizer, residuals)";
    const WORLD: &str = "the checkpoint holds one file per worker";
    const METRICS: &str = "the run's metrics file is written in that format";
    const START: &str = "a resume does not use it (it applies to a fresh run's start only)";
    match key {
        "run-dir" | "resume" | "resume-ranks" | "print-config" | "export" | "export-rank" => {
            SettingRule::Invocation
        }
        "steps"
        | "epochs"
        | "lr"
        | "lr-schedule"
        | "lr-step-size"
        | "lr-gamma"
        | "lr-min"
        | "lr-warmup-steps"
        | "lr-warmup-start-factor"
        | "checkpoint-every"
        | "keep-checkpoints"
        | "log-every"
        | "eval-every"
        | "on-rank-failure"
        | "timeout-secs"
        | "progress"
        | "backend"
        | "device"
        | "pipeline-buckets"
        | "bucket-cap-mb"
        | "first-bucket-mb"
        | "flush-denormals" => SettingRule::Changeable,
        // Where the data is (a data set moved since): the run continues at its data position,
        // so the data must be the same.
        "data-dir" | "text-file" => SettingRule::Changeable,
        "workers" => SettingRule::Fixed(WORLD),
        "model" | "hidden" | "channels" | "context" | "d-model" | "heads" | "layers" => {
            SettingRule::Fixed(MODEL)
        }
        "dataset" | "synthetic-samples" | "synthetic-dim" | "synthetic-classes" => {
            SettingRule::Fixed(DATA)
        }
        "batch-size" | "accumulate" | "accumulation" | "shuffle" => SettingRule::Fixed(ORDER),
        "seed" => SettingRule::Fixed(SEED),
        "optimizer"
        | "momentum"
        | "weight-decay"
        | "weight-decay-matrices-only"
        | "clip-grad-norm"
        | "skip-non-finite" => SettingRule::Fixed(OPTIMIZER),
        "metrics-format" => SettingRule::Fixed(METRICS),
        "broadcast-start" | "init-weights" => SettingRule::Fixed(START),
        // The algorithm section, and any setting added later until it is classified.
        _ => SettingRule::Fixed(ALGORITHM),
    }
}

/// Why a run cannot be resumed as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The run directory has no `config.toml` (not a `localsgd train` run directory).
    #[error(
        "cannot resume: {0} does not exist (a run directory of `localsgd train` has it; run without `resume` first, or point `run-dir` at such a directory)"
    )]
    NoConfig(PathBuf),
    /// The run's `config.toml` cannot be read.
    #[error("cannot resume: {path}: {reason}")]
    BadConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A setting the checkpoint fixes was given another value.
    #[error("cannot resume with {0}")]
    Fixed(Box<FixedSetting>),
    /// The run already reached the length asked for.
    #[error("cannot resume: {0}")]
    Reached(String),
    /// The checkpoint cannot be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// A setting the checkpoint fixes, given another value ([`ResumeError::Fixed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixedSetting {
    /// The setting (TOML name).
    pub setting: String,
    /// Its value in the run's `config.toml`.
    pub saved: String,
    /// The value given now.
    pub given: String,
    /// What fixes it.
    pub why: &'static str,
    /// What to do instead.
    pub instead: String,
    /// The run directory.
    pub dir: PathBuf,
}

impl std::fmt::Display for FixedSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            setting,
            saved,
            given,
            why,
            instead,
            dir,
        } = self;
        write!(
            f,
            "`{setting}` = {given}: the run in {} was started with `{setting}` = {saved}, and \
             {why}; {instead}",
            dir.display()
        )
    }
}

/// A setting a resume changes: its TOML name and its value before and from now on (`None`:
/// unset).
#[derive(Debug, Clone, PartialEq)]
pub struct SettingChange {
    /// The setting (TOML name).
    pub setting: String,
    /// The run's value so far.
    pub before: Option<toml::Value>,
    /// The value from the resumed iteration on.
    pub after: Option<toml::Value>,
}

/// A run's `config.toml`: its settings and the history of its resumes.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// The settings (every key the file has).
    pub settings: toml::Table,
    /// The `[[resumed]]` tables, oldest first.
    pub history: Vec<toml::Table>,
    path: PathBuf,
}

impl RunSettings {
    /// Read `run_dir/config.toml`.
    pub fn read(run_dir: &Path) -> Result<Self, ResumeError> {
        let path = run_dir.join("config.toml");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ResumeError::NoConfig(path));
            }
            Err(e) => {
                return Err(ResumeError::BadConfig {
                    path,
                    reason: e.to_string(),
                });
            }
        };
        let bad = |reason| ResumeError::BadConfig {
            path: path.clone(),
            reason,
        };
        let (mut settings, history) = split_history(&text).map_err(bad)?;
        // A file written before `keep-checkpoints` existed: that version kept every checkpoint.
        settings
            .entry("keep-checkpoints")
            .or_insert(toml::Value::Integer(0));
        // The settings must still make a configuration (a file edited by hand may not). Values
        // the run did not use (a version that accepted them wrote them) count as unset.
        let mut run = TrainConfig::from_table(settings)
            .map_err(bad)?
            .without_unused();
        // After ranks left (`on-rank-failure = "continue"`) the latest checkpoint is the
        // survivors': the run goes on with their number, and hierarchical averaging's
        // whole-world level as they ran it.
        if let Ok((_, saved)) = CheckpointDir::new(run_dir).latest_identity()
            && saved.world_size != run.workers
        {
            if let Ok(spec) = run.algorithm_spec() {
                run.levels = Levels::from(spec.for_world(saved.world_size).levels);
            }
            run.workers = saved.world_size;
        }
        Ok(Self {
            settings: table_of(&run),
            history,
            path,
        })
    }

    /// The settings a resume inherits: every key but the invocation's own.
    pub fn inherited(&self) -> toml::Table {
        self.settings
            .iter()
            .filter(|(k, _)| rule(k) != SettingRule::Invocation)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The run's configuration as its file says.
    pub fn config(&self) -> Result<TrainConfig, ResumeError> {
        TrainConfig::from_table(self.settings.clone()).map_err(|reason| ResumeError::BadConfig {
            path: self.path.clone(),
            reason,
        })
    }
}

/// What a resume will do, checked: the settings it changes and the iterations the checkpoint
/// holds.
#[derive(Debug, Clone)]
pub struct ResumePlan {
    /// The run's `config.toml` as it was.
    pub saved: RunSettings,
    /// The settings this resume changes.
    pub changes: Vec<SettingChange>,
    /// The iterations the latest checkpoint holds (the resumed run's first is this one).
    pub iterations: u64,
}

impl ResumePlan {
    /// Check a resume of `cfg.run_dir` with the settings `cfg` (already combined with the run's
    /// own by [`ConfigFlags::resolve`](crate::config::ConfigFlags::resolve)): every setting
    /// the checkpoint fixes keeps its value, and the run is not already as long as asked. Reads
    /// the run directory, writes nothing.
    pub fn check(cfg: &TrainConfig) -> Result<Self, ResumeError> {
        let dir = &cfg.run_dir;
        let saved = RunSettings::read(dir)?;
        let run = saved.config()?;
        let before = table_of(&run.with_defaults_filled());
        let after = table_of(&cfg.with_defaults_filled());
        // On another number of workers (`resume-ranks`), the settings as the saving world ran
        // them: hierarchical averaging's whole-world level has the world's size
        // (`AlgorithmSpec::for_world`).
        let as_saved = match cfg.resume_ranks.is_empty() {
            true => after.clone(),
            false => {
                let mut c = cfg.with_defaults_filled();
                if let Ok(spec) = cfg.algorithm_spec() {
                    c.levels = Levels::from(spec.for_world(run.workers).levels);
                }
                c.workers = run.workers;
                table_of(&c)
            }
        };
        let mut changes = Vec::new();
        for setting in SETTINGS {
            let key = setting.field.replace('_', "-");
            let (b, a) = (before.get(&key), after.get(&key));
            if b == a {
                continue;
            }
            match rule(&key) {
                SettingRule::Invocation => continue,
                // `epochs` does not end a run that has `steps`: not a change of it.
                SettingRule::Changeable if key == "epochs" && cfg.steps.is_some() => continue,
                SettingRule::Changeable => {}
                SettingRule::Fixed(_) if b == as_saved.get(&key) => {}
                SettingRule::Fixed(why) => {
                    let instead = match key.as_str() {
                        "workers" => format!(
                            "resume it on {} workers, or give `resume-ranks` (the saved rank \
                             each new worker continues from) to continue it on another number",
                            show(b)
                        ),
                        _ => format!(
                            "drop the setting (the run keeps {}), or start a new run in \
                             another `run-dir`",
                            show(b)
                        ),
                    };
                    return Err(ResumeError::Fixed(Box::new(FixedSetting {
                        setting: key,
                        saved: show(b),
                        given: show(a),
                        why,
                        instead,
                        dir: dir.clone(),
                    })));
                }
            }
            changes.push(SettingChange {
                setting: key,
                before: b.cloned(),
                after: a.cloned(),
            });
        }
        let iterations = CheckpointDir::new(dir).latest_iterations()?;
        // A run limited by epochs is checked where the data says how long an epoch is
        // (`run::preflight`).
        if let Some(steps) = cfg.steps
            && steps <= iterations
        {
            return Err(ResumeError::Reached(format!(
                "`steps` = {steps} is already reached: the latest checkpoint in {} holds \
                 {iterations} iterations; give `steps` above {iterations} to train on",
                dir.display()
            )));
        }
        Ok(Self {
            saved,
            changes,
            iterations,
        })
    }

    /// The run's new `config.toml`: `cfg`'s effective settings, then the history so far and,
    /// when this resume changes settings, its own `[[resumed]]` table (the iteration from which
    /// they hold, their values from then on and before).
    pub fn config_toml(&self, cfg: &TrainConfig) -> String {
        let mut history: Vec<toml::Value> = self
            .saved
            .history
            .iter()
            .cloned()
            .map(toml::Value::Table)
            .collect();
        if !self.changes.is_empty() {
            let mut entry = toml::Table::new();
            entry.insert(
                "iteration".into(),
                toml::Value::Integer(i64::try_from(self.iterations).unwrap_or(i64::MAX)),
            );
            let (mut settings, mut before) = (toml::Table::new(), toml::Table::new());
            let unset = || toml::Value::String("(unset)".into());
            for c in &self.changes {
                settings.insert(c.setting.clone(), c.after.clone().unwrap_or_else(unset));
                before.insert(c.setting.clone(), c.before.clone().unwrap_or_else(unset));
            }
            entry.insert("settings".into(), toml::Value::Table(settings));
            entry.insert("before".into(), toml::Value::Table(before));
            history.push(toml::Value::Table(entry));
        }
        // The file describes the run, not this invocation: given back with `--config`, it
        // trains the run from the start.
        let mut run = cfg.with_defaults_filled();
        run.resume = false;
        run.resume_ranks.clear();
        let mut text = run.to_toml();
        if !history.is_empty() {
            let mut table = toml::Table::new();
            table.insert(HISTORY_KEY.into(), toml::Value::Array(history));
            text.push('\n');
            text.push_str(&toml::to_string(&table).unwrap_or_default());
        }
        text
    }
}

fn table_of(cfg: &TrainConfig) -> toml::Table {
    toml::from_str(&cfg.to_toml()).unwrap_or_default()
}

fn show(value: Option<&toml::Value>) -> String {
    value.map_or_else(|| "(unset)".to_string(), toml::Value::to_string)
}
