//! `Pipeline::run_epoch`, the loop of a training run: it stops at the epoch's end (every rank
//! together, uneven shards included), at the iteration budget, or when the observer asks, and
//! its iterations are the ones a hand-written `run_iteration` loop runs (the same parameters to
//! the bit).

use burn::module::{Module, Param};
use burn::optim::SgdConfig;
use burn::tensor::{Device, Tensor, TensorData};
use localsgd_comm::ThreadWorld;
use localsgd_comm::params::{FlatBuffer, ParamSelection, flatten_params};
use localsgd_pipeline::algorithm::{AlgorithmSpec, build};
use localsgd_pipeline::pipeline::{
    EpochEnd, IterSource, IterationReport, LossFn, NoObserver, ObserverError, Outcome, Pipeline,
    PipelineOptions,
};

/// A user's model: `x w`.
#[derive(Module, Debug)]
struct Linear1 {
    w: Param<Tensor<2>>,
}

type Batch = (Tensor<2>, Tensor<2>);

fn device() -> Device {
    Device::flex().autodiff()
}

fn model() -> Linear1 {
    let w = Tensor::from_data(TensorData::new(vec![0.5f32, -0.25], [2, 1]), &device());
    Linear1 {
        w: Param::from_tensor(w),
    }
}

fn loss(m: &Linear1, (x, y): &Batch) -> Tensor<1> {
    let d = x.clone().matmul(m.w.val()) - y.clone();
    (d.clone() * d).mean()
}

/// `n` batches of 2 rows for `rank`.
fn batches(rank: usize, n: usize) -> Vec<Batch> {
    (0..n)
        .map(|i| {
            let v = |k: usize| ((rank * 31 + i * 7 + k) % 11) as f32 / 5.0 - 1.0;
            let x = Tensor::from_data(
                TensorData::new(vec![v(0), v(1), v(2), v(3)], [2, 2]),
                &device(),
            );
            let y = Tensor::from_data(TensorData::new(vec![v(4), v(5)], [2, 1]), &device());
            (x, y)
        })
        .collect()
}

fn params(m: &Linear1) -> Vec<f32> {
    match flatten_params(m, &ParamSelection::All).unwrap().buffer {
        FlatBuffer::F32(v) => v,
        FlatBuffer::F64(v) => v.into_iter().map(|x| x as f32).collect(),
    }
}

fn pipeline(group: localsgd_comm::Group) -> Pipeline<Linear1> {
    let parts = build(&AlgorithmSpec::post_local_sgd(2, 2), &group).unwrap();
    let options = PipelineOptions {
        lr: 0.1,
        ..PipelineOptions::default()
    };
    Pipeline::new(group, SgdConfig::new().init(), options).with_parts(parts)
}

/// Rank 0 has 5 batches, rank 1 has 7: the epoch ends for both after 5 iterations, as a
/// hand-written loop ends it, with the same parameters.
#[test]
fn an_epoch_ends_on_every_rank_with_the_shortest_shard_as_a_hand_written_loop() {
    let runs = ThreadWorld::new(2)
        .unwrap()
        .run(|group| {
            let rank = group.rank();
            let n = [5, 7][rank];
            let mut p = pipeline(group.clone());
            let (m, end) = p
                .run_epoch(
                    model(),
                    &mut IterSource(batches(rank, n).into_iter()),
                    &mut LossFn(&loss),
                    &mut NoObserver,
                    None,
                )
                .unwrap();
            let by_epoch = (params(&m), end, p.iteration());

            let mut p = pipeline(group);
            let mut source = IterSource(batches(rank, n).into_iter());
            let mut m = model();
            loop {
                match p.run_iteration(m, &mut source, &loss).unwrap() {
                    Outcome::Trained(next, _) => m = next,
                    Outcome::EndOfData(next) => {
                        m = next;
                        break;
                    }
                }
            }
            (by_epoch, params(&m), p.iteration())
        })
        .unwrap();
    for ((by_epoch, by_hand, iterations), rank) in runs.iter().zip(0..) {
        assert_eq!(by_epoch.1, EpochEnd::EndOfData, "rank {rank}");
        assert_eq!(by_epoch.2, 5, "rank {rank}");
        assert_eq!(*iterations, 5, "rank {rank}");
        assert_eq!(by_epoch.0, *by_hand, "rank {rank}");
        assert_ne!(by_epoch.0, params(&model()), "rank {rank} did not train");
    }
}

/// A budget of 3 iterations stops there; an observer that says stop after its second report
/// stops after 2, having seen iterations 0 and 1 in order.
#[test]
fn the_budget_and_the_observer_stop_the_epoch() {
    let ends = ThreadWorld::new(2)
        .unwrap()
        .run(|group| {
            let rank = group.rank();
            let mut p = pipeline(group.clone());
            let (_, end) = p
                .run_epoch(
                    model(),
                    &mut IterSource(batches(rank, 6).into_iter()),
                    &mut LossFn(&loss),
                    &mut NoObserver,
                    Some(3),
                )
                .unwrap();
            let budget = (end, p.iteration());

            let mut p = pipeline(group);
            let mut seen = Vec::new();
            let mut observer = |r: &IterationReport, _: &Linear1| -> Result<bool, ObserverError> {
                seen.push(r.iteration);
                Ok(seen.len() < 2)
            };
            let (_, end) = p
                .run_epoch(
                    model(),
                    &mut IterSource(batches(rank, 6).into_iter()),
                    &mut LossFn(&loss),
                    &mut observer,
                    None,
                )
                .unwrap();
            (budget, (end, p.iteration()), seen)
        })
        .unwrap();
    for (budget, stopped, seen) in ends {
        assert_eq!(budget, (EpochEnd::Budget, 3));
        assert_eq!(stopped, (EpochEnd::Stopped, 2));
        assert_eq!(seen, vec![0, 1]);
    }
}

/// The pipeline's running total is the start broadcast plus every iteration's report; the
/// start broadcast's data is the model's f32 size (2 parameters: 8 bytes).
#[test]
fn the_running_traffic_total_is_the_start_broadcast_and_the_iterations() {
    let totals = ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            let spec = AlgorithmSpec::post_local_sgd(2, 2);
            let mut pipeline = Pipeline::new(
                world.clone(),
                SgdConfig::new().init(),
                PipelineOptions::default(),
            )
            .with_parts(build(&spec, &world).unwrap());
            assert_eq!(pipeline.traffic(), Default::default());
            let mut source = IterSource(batches(world.rank(), 5).into_iter());
            let mut model = model();
            let mut reported = localsgd_comm::Traffic::default();
            for _ in 0..5 {
                match pipeline.run_iteration(model, &mut source, &loss).unwrap() {
                    Outcome::Trained(m, report) => {
                        model = m;
                        reported += report.traffic;
                    }
                    Outcome::EndOfData(m) => model = m,
                }
            }
            (pipeline.traffic(), pipeline.start_traffic(), reported)
        })
        .unwrap();
    for (total, start, reported) in totals {
        assert_eq!(start.data_bytes, 8);
        assert_eq!(total, start + reported);
        assert!(reported.data_bytes > 0);
    }
}

/// What `before_iteration` sees: every iteration's index before it starts, and once more the
/// index of the attempt that finds the epoch over; an error there stops the run before the
/// iteration, on that rank, as `PipelineError::Observer`.
#[derive(Default)]
struct Watch {
    before: Vec<u64>,
    after: Vec<u64>,
    fail_before: Option<u64>,
}

impl localsgd_pipeline::pipeline::IterationObserver<Linear1> for Watch {
    fn before_iteration(&mut self, iteration: u64) -> Result<(), ObserverError> {
        if self.fail_before == Some(iteration) {
            return Err(format!("refused iteration {iteration}").into());
        }
        self.before.push(iteration);
        Ok(())
    }

    fn after_iteration(&mut self, r: &IterationReport, _: &Linear1) -> Result<bool, ObserverError> {
        self.after.push(r.iteration);
        Ok(true)
    }
}

#[test]
fn before_iteration_runs_before_every_iteration_and_the_attempt_that_ends_the_epoch() {
    let runs = ThreadWorld::new(1)
        .unwrap()
        .run(|group| {
            let mut p = pipeline(group.clone());
            let mut watch = Watch::default();
            p.run_epoch(
                model(),
                &mut IterSource(batches(0, 3).into_iter()),
                &mut LossFn(&loss),
                &mut watch,
                None,
            )
            .unwrap();
            let mut p = pipeline(group);
            let mut failing = Watch {
                fail_before: Some(2),
                ..Watch::default()
            };
            let err = p
                .run_epoch(
                    model(),
                    &mut IterSource(batches(0, 3).into_iter()),
                    &mut LossFn(&loss),
                    &mut failing,
                    None,
                )
                .err()
                .map(|e| e.to_string());
            (watch.before, watch.after, failing.after, p.iteration(), err)
        })
        .unwrap();
    let (before, after, failing_after, failing_iterations, err) = &runs[0];
    assert_eq!(before, &vec![0, 1, 2, 3]);
    assert_eq!(after, &vec![0, 1, 2]);
    assert_eq!(failing_after, &vec![0, 1]);
    assert_eq!(*failing_iterations, 2);
    assert_eq!(
        err.as_deref(),
        Some("observing the iteration: refused iteration 2")
    );
}

/// A rank that dies (its thread panics before its second iteration) leaves its peer with an
/// error that says a peer is gone (`PipelineError::is_peer_lost`, what a run that survives a
/// failed rank recovers from), whatever phase met it; the rank's own mistakes do not say so.
#[test]
fn a_dead_peer_is_told_apart_from_the_ranks_own_error() {
    let results = ThreadWorld::new(2).unwrap().run_each(|group| {
        let rank = group.rank();
        let mut p = pipeline(group);
        let mut dies = |r: &IterationReport, _: &Linear1| -> Result<bool, ObserverError> {
            if rank == 1 && r.iteration == 0 {
                panic!("rank 1 dies");
            }
            Ok(true)
        };
        p.run_epoch(
            model(),
            &mut IterSource(batches(rank, 4).into_iter()),
            &mut LossFn(&loss),
            &mut dies,
            None,
        )
        .err()
    });
    assert!(results[1].is_err(), "rank 1 panicked");
    let err = results[0]
        .as_ref()
        .unwrap()
        .as_ref()
        .expect("rank 0 failed");
    assert!(err.is_peer_lost(), "{err}");
    let own = localsgd_pipeline::pipeline::PipelineError::Observer("disk full".into());
    assert!(!own.is_peer_lost());
}
