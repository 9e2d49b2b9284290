//! Fault injection, for rehearsing failures (the project's fault soak, and operators testing
//! their own job scripts): the environment variable `LOCALSGD_FAULT=KIND@RANK:ITERATION` makes
//! one rank of a `localsgd train` run fail in a chosen way just before that iteration (0-based)
//! starts; several faults are separated by commas (`panic@1:5,panic@3:9`). `RANK` is the
//! rank in the job's first world: after ranks left (`on-rank-failure = "continue"`) it still
//! names the same worker. Unset (the normal case) nothing is injected.
//!
//! | `KIND` | what the rank does | what the run reports |
//! |---|---|---|
//! | `panic` | panics | the rank's panic, its peers' "rank R failed" |
//! | `stall` | sleeps `timeout-secs` + 3 s, then goes on | the peers' collective timeout naming the rank |
//! | `abort` | ends its process at once (`abort`: no cleanup, like `kill -9`) | threads: the process dies with the signal; MPI: `mpirun` names the rank |
//! | `kill` | sends its process `SIGKILL` (`kill -9`: nothing of the process runs afterwards) | as `abort` |
//! | `mismatch` | issues a barrier where its peers all-reduce | a collective mismatch naming each rank's call |
//! | `short` | its data runs out here (an uneven shard) | nothing: every rank ends the epoch together |
//! | `step` | fails inside iteration `ITERATION`'s forward pass, after the ranks agreed there is data (its peers meet the failure in the gradient sync or the average): panics (threads) or ends its process (MPI, NCCL) | as `panic` or `abort` |
//! | `checkpoint` | after the checkpoint of `ITERATION` iterations (`checkpoints/step-ITERATION`) was written, before it is published: panics (threads) or ends its process (`abort`; MPI, NCCL); `ITERATION` must be a multiple of `checkpoint-every` | as `panic` or `abort`; `latest` still names the previous checkpoint |
//!
//! A fault that can never fire (a rank outside the world, an iteration at or past the run's
//! end, or before a resumed run's first, a checkpoint the run does not write) is refused
//! before the run starts ([`Fault::check`]).
//!
//! ```
//! use localsgd_trainer::fault::{Fault, FaultKind};
//! let f: Fault = "stall@1:7".parse()?;
//! assert_eq!(f, Fault { kind: FaultKind::Stall, rank: 1, iteration: 7 });
//! assert!("stall@one:7".parse::<Fault>().is_err());
//! let two = Fault::parse_list("panic@1:5,panic@3:9")?;
//! assert_eq!(two.len(), 2);
//! # Ok::<(), String>(())
//! ```

use std::str::FromStr;

/// The environment variable read by [`Fault::from_env`].
pub const ENV: &str = "LOCALSGD_FAULT";

/// What the faulty rank does (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Panic.
    Panic,
    /// Sleep past the collective timeout, then continue.
    Stall,
    /// End the process at once, without cleanup.
    Abort,
    /// Send the process `SIGKILL`.
    Kill,
    /// Issue a collective its peers do not.
    Mismatch,
    /// Run out of data (an uneven shard); not an error.
    Short,
    /// Fail inside the iteration's forward pass (its peers meet the failure in a later phase
    /// of the same iteration): a panic on the thread backend, the process's end with one
    /// process per rank.
    Step,
    /// Fail after the iteration's checkpoint was written and sealed, before it is published (a
    /// failure in the middle of a checkpoint: the previous one stays `latest`): a panic on the
    /// thread backend, the process's end (as `Abort`) with one process per rank.
    Checkpoint,
}

/// One injected fault: `kind` on `rank` before iteration `iteration` (a `checkpoint` fault:
/// after the checkpoint of `iteration` iterations was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// What happens.
    pub kind: FaultKind,
    /// The world rank it happens on.
    pub rank: usize,
    /// The 0-based iteration before which it happens; for a `checkpoint` fault, the iterations
    /// the checkpoint holds.
    pub iteration: u64,
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{ENV} = {s:?}: expected KIND@RANK:ITERATION with KIND one of panic, stall, \
                 abort, kill, mismatch, short, step, checkpoint (e.g. \"panic@1:10\")"
            )
        };
        let (kind, at) = s.split_once('@').ok_or_else(bad)?;
        let (rank, iteration) = at.split_once(':').ok_or_else(bad)?;
        let kind = match kind {
            "panic" => FaultKind::Panic,
            "stall" => FaultKind::Stall,
            "abort" => FaultKind::Abort,
            "kill" => FaultKind::Kill,
            "mismatch" => FaultKind::Mismatch,
            "short" => FaultKind::Short,
            "checkpoint" => FaultKind::Checkpoint,
            "step" => FaultKind::Step,
            _ => return Err(bad()),
        };
        Ok(Self {
            kind,
            rank: rank.parse().map_err(|_| bad())?,
            iteration: iteration.parse().map_err(|_| bad())?,
        })
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            FaultKind::Panic => "panic",
            FaultKind::Stall => "stall",
            FaultKind::Abort => "abort",
            FaultKind::Kill => "kill",
            FaultKind::Mismatch => "mismatch",
            FaultKind::Short => "short",
            FaultKind::Step => "step",
            FaultKind::Checkpoint => "checkpoint",
        };
        write!(f, "{kind}@{}:{}", self.rank, self.iteration)
    }
}

impl Fault {
    /// The faults `LOCALSGD_FAULT` asks for (none when it is unset).
    pub fn from_env() -> Result<Vec<Self>, String> {
        match std::env::var(ENV) {
            Ok(v) => Self::parse_list(&v),
            Err(std::env::VarError::NotPresent) => Ok(Vec::new()),
            Err(std::env::VarError::NotUnicode(v)) => Err(format!("{ENV} = {v:?}: not UTF-8")),
        }
    }

    /// Comma-separated faults (`panic@1:5,panic@3:9`).
    pub fn parse_list(s: &str) -> Result<Vec<Self>, String> {
        s.split(',').map(|f| f.trim().parse()).collect()
    }

    /// Whether it is due on `rank` (of the job's first world) before `iteration` (a
    /// `checkpoint` fault: after the checkpoint of `iteration` iterations was written).
    pub fn due(&self, rank: usize, iteration: u64) -> bool {
        self.rank == rank && self.iteration == iteration
    }

    /// Refuse a fault that can never fire in a run of `workers` ranks that trains iterations
    /// `start..end` (`end`: `None` when only the data decides where the run ends) and writes a
    /// checkpoint every `checkpoint_every` iterations (0: only the final one).
    pub fn check(
        &self,
        workers: usize,
        start: u64,
        end: Option<u64>,
        checkpoint_every: u64,
    ) -> Result<(), String> {
        let never = |why: String| Err(format!("{ENV}: {self} can never fire: {why}",));
        if self.rank >= workers {
            return never(format!(
                "this run has {workers} worker(s), ranks 0..{workers}"
            ));
        }
        if self.kind == FaultKind::Checkpoint {
            if checkpoint_every == 0 {
                return never(
                    "the run writes no checkpoint during training (set `checkpoint-every`)".into(),
                );
            }
            let written = self.iteration > start
                && self.iteration.is_multiple_of(checkpoint_every)
                && end.is_none_or(|end| self.iteration <= end);
            if !written {
                let last = end.map_or_else(String::new, |end| format!(" up to {end}"));
                return never(format!(
                    "the run writes the checkpoints of the multiples of `checkpoint-every` = \
                     {checkpoint_every} after iteration {start}{last} (ITERATION names the \
                     checkpoint's iterations, `checkpoints/step-ITERATION`)"
                ));
            }
            return Ok(());
        }
        if self.iteration < start || end.is_some_and(|end| self.iteration >= end) {
            let range = end.map_or_else(|| format!("{start}.."), |end| format!("{start}..{end}"));
            return never(format!("the run trains the 0-based iterations {range}"));
        }
        Ok(())
    }
}
