//! Semantics §3 (the book): several averaging levels, e.g. "every 2 steps within pairs of ranks,
//! every 8 steps over everyone".

use crate::error::AveragerError;
use crate::schedule::{Schedule, Scheduled};
use crate::state::{AveragerConfig, Level};
use localsgd_comm::{CommError, Group, validate_subgroup_size};

/// Averages within contiguous blocks of ranks at several periods (PyTorch's
/// `HierarchicalModelAverager`).
///
/// Each level `(period, group_size)` means "every `period` steps, average within contiguous
/// blocks of `group_size` ranks of `group`" (size 2 on 4 ranks: {0,1} and {2,3}). At a step
/// divisible by several periods only the level with the largest period averages.
///
/// The schedule counts **absolute steps**, not steps after the warmup: levels `[(4, ws)]` with
/// warmup 13 average first at step 16, while
/// [`PeriodicModelAverager`](crate::PeriodicModelAverager)`(4, 13)` averages at 13 and 17. The
/// warmup only suppresses averaging before it.
///
/// Unlike PyTorch, periods must be strictly increasing (a later level with a smaller or equal
/// period would silently shadow the earlier one) and every period is validated.
///
/// ```
/// use localsgd_averagers::{HierarchicalModelAverager, ModelAverager};
/// use localsgd_comm::ThreadWorld;
///
/// let out = ThreadWorld::new(4)?.run(|world| {
///     // Pairs every 2 steps, everyone every 4 steps, nothing before step 4.
///     let mut avg = HierarchicalModelAverager::new(&[(2, 2), (4, 4)], 4, world).unwrap();
///     let mut sizes = Vec::new();
///     for _ in 0..9 {
///         sizes.push(avg.scheduled_group().map_or(0, |g| g.size()));
///         avg.advance();
///     }
///     sizes
/// })?;
/// assert_eq!(out[0], vec![0, 0, 0, 0, 4, 0, 2, 0, 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type HierarchicalModelAverager = Scheduled<Hierarchical>;

/// The schedule of a [`HierarchicalModelAverager`]: its levels with their groups, after a
/// warmup.
#[derive(Debug)]
pub struct Hierarchical {
    levels: Vec<(Level, Group)>,
    created: Vec<usize>,
    warmup_steps: u64,
}

impl HierarchicalModelAverager {
    /// An averager over `group` with `levels` given as `(period, group size)` in order of
    /// strictly increasing period, the last one covering the whole group; step counter 0.
    ///
    /// **Collective** over `group`: every rank must call it with the same levels (it creates the
    /// level subgroups once, here). A level whose size equals the group size uses `group` itself;
    /// levels sharing a size share one family of subgroups.
    ///
    /// Checked on every rank before any communication, in this order: no levels →
    /// [`AveragerError::EmptyLevels`]; a period of 0 in any level →
    /// [`AveragerError::NonPositiveLevelPeriod`]; periods not strictly increasing →
    /// [`AveragerError::ShadowedLevel`]; last size ≠ group size →
    /// [`AveragerError::LastLevelNotWholeGroup`]; a size that is 0, larger than the group or not
    /// dividing it → [`AveragerError::InvalidLevelGroupSize`]; `warmup_steps < 0` →
    /// [`AveragerError::NegativeWarmup`]. A last period of 1 is allowed but logs a warning.
    pub fn new<L: Into<Level> + Copy>(
        levels: &[L],
        warmup_steps: i64,
        group: Group,
    ) -> Result<Self, AveragerError> {
        let levels: Vec<Level> = levels.iter().map(|&l| l.into()).collect();
        let group_size = group.size();
        validate_levels(&levels, group_size)?;
        let warmup_steps =
            u64::try_from(warmup_steps).map_err(|_| AveragerError::NegativeWarmup(warmup_steps))?;
        if let Some(&Level {
            period: 1,
            group_size: size,
        }) = levels.last()
        {
            tracing::warn!(
                period = 1,
                group_size = size,
                "the last level averages over the whole group after every step, which costs at \
                 least as much as all-reducing gradients: plain data parallelism (DDP) is the \
                 better choice"
            );
        }

        let mut created: Vec<(usize, Group)> = Vec::new();
        let mut built = Vec::with_capacity(levels.len());
        for &Level {
            period,
            group_size: size,
        } in &levels
        {
            let level_group = if size == group_size {
                group.clone()
            } else if let Some((_, g)) = created.iter().find(|(s, _)| *s == size) {
                g.clone()
            } else {
                let g = group.new_subgroups(size)?;
                created.push((size, g.clone()));
                g
            };
            built.push((
                Level {
                    period,
                    group_size: size,
                },
                level_group,
            ));
        }
        Ok(Scheduled::from_schedule(Hierarchical {
            levels: built,
            created: created.into_iter().map(|(s, _)| s).collect(),
            warmup_steps,
        }))
    }

    /// Block sizes for which this averager created subgroups, in creation order (sizes equal to
    /// the group size reuse the group and are not listed).
    pub fn subgroup_sizes_created(&self) -> Vec<usize> {
        self.schedule().created.clone()
    }

    /// The levels, in order of increasing period.
    pub fn levels(&self) -> Vec<Level> {
        self.schedule().levels.iter().map(|(l, _)| *l).collect()
    }

    /// This rank's group for each level, in level order.
    pub fn level_groups(&self) -> Vec<Group> {
        self.schedule()
            .levels
            .iter()
            .map(|(_, g)| g.clone())
            .collect()
    }

    /// Steps before the first averaging.
    pub fn warmup_steps(&self) -> u64 {
        self.schedule().warmup_steps
    }
}

impl Schedule for Hierarchical {
    fn group_at(&self, step: u64) -> Option<Group> {
        if step < self.warmup_steps {
            return None;
        }
        self.levels
            .iter()
            .rev()
            .find(|(level, _)| step.is_multiple_of(level.period))
            .map(|(_, g)| g.clone())
    }

    fn config(&self) -> AveragerConfig {
        AveragerConfig::Hierarchical {
            levels: self.levels.iter().map(|(l, _)| *l).collect(),
            warmup_steps: self.warmup_steps,
        }
    }
}

/// The rules a hierarchical averager's levels must follow over a group of `group_size` ranks,
/// checked in the order [`HierarchicalModelAverager::new`] lists them (without the warmup). The
/// one place these rules live: the binary's `levels` setting is checked with it too.
pub fn validate_levels(levels: &[Level], group_size: usize) -> Result<(), AveragerError> {
    let Some(last) = levels.last() else {
        return Err(AveragerError::EmptyLevels);
    };
    if let Some((index, l)) = levels.iter().enumerate().find(|(_, l)| l.period == 0) {
        return Err(AveragerError::NonPositiveLevelPeriod {
            index,
            period: l.period,
            size: l.group_size,
        });
    }
    for (index, pair) in levels.windows(2).enumerate() {
        let (previous, level) = (pair[0], pair[1]);
        if level.period <= previous.period {
            return Err(AveragerError::ShadowedLevel {
                index: index + 1,
                period: level.period,
                size: level.group_size,
                previous_index: index,
                previous_period: previous.period,
                previous_size: previous.group_size,
            });
        }
    }
    if last.group_size != group_size {
        return Err(AveragerError::LastLevelNotWholeGroup {
            index: levels.len() - 1,
            period: last.period,
            size: last.group_size,
            group_size,
        });
    }
    for (index, level) in levels.iter().enumerate() {
        if let Err(e) = validate_subgroup_size(level.group_size, group_size) {
            let reason = match e {
                CommError::InvalidSubgroupSize(reason) => reason,
                other => other.to_string(),
            };
            return Err(AveragerError::InvalidLevelGroupSize {
                index,
                period: level.period,
                size: level.group_size,
                reason,
            });
        }
    }
    Ok(())
}
