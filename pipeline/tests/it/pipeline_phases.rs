//! Unit tests of the pipeline's phases and their order, on 2 thread workers and a tiny MLP.

use burn::tensor::{Device, Int, Tensor};
use localsgd_comm::ThreadWorld;
use localsgd_models::data::{Dataset, synthetic};
use localsgd_models::mlp::{Mlp, MlpConfig};
use localsgd_models::network::loss;
use localsgd_pipeline::algorithm::{AlgorithmSpec, build};
use localsgd_pipeline::pipeline::{
    BatchSource, ITERATION_ORDER, IterSource, Outcome, Phase, Pipeline, PipelineError,
    PipelineOptions, SourceError,
};
use localsgd_pipeline::settings::{AlgorithmKind, GradientCompression, PipelineBuckets};
use std::sync::{Arc, Mutex};

type Batch = (Tensor<2>, Tensor<1, Int>);

fn spec(kind: AlgorithmKind) -> AlgorithmSpec {
    pipelined_spec(kind, true)
}

fn pipelined_spec(kind: AlgorithmKind, pipelined: bool) -> AlgorithmSpec {
    AlgorithmSpec {
        pipeline_buckets: if pipelined {
            PipelineBuckets::On
        } else {
            PipelineBuckets::Off
        },
        kind,
        warmup: 2,
        // Each algorithm with the settings it takes: DDP neither a period nor levels,
        // hierarchical averaging levels, the others a period.
        period: match kind {
            AlgorithmKind::Ddp | AlgorithmKind::Hierarchical => None,
            _ => Some(2),
        },
        overlap: 0,
        levels: match kind {
            AlgorithmKind::Hierarchical => vec![(2, 2).into()],
            _ => Vec::new(),
        },
        subgroup_size: None,
        post_local_allreduce: true,
        // Small caps: several buckets, so pipelining has something to overlap.
        caps: localsgd_hooks::BucketCaps {
            first_bytes: 16,
            rest_bytes: 32,
        },
        compression: GradientCompression::None,
        outer: None,
    }
}

fn data() -> Dataset {
    synthetic::generate(64, 4, 3, 7).unwrap()
}

fn batches(data: &Dataset, rank: usize, count: usize, device: &Device) -> Vec<Batch> {
    (0..count)
        .map(|i| {
            let idx: Vec<usize> = (0..4)
                .map(|j| (rank * 31 + i * 4 + j) % data.len())
                .collect();
            data.batch_tensors(&idx, device).unwrap()
        })
        .collect()
}

fn model(device: &Device) -> Mlp {
    MlpConfig {
        input: 4,
        hidden: vec![5],
        classes: 3,
    }
    .init(3, device)
    .unwrap()
}

fn pipeline(
    group: localsgd_comm::Group,
    kind: AlgorithmKind,
    opts: PipelineOptions,
) -> Pipeline<Mlp> {
    pipeline_with(
        group,
        spec(kind),
        burn::optim::SgdConfig::new().init(),
        opts,
    )
}

fn pipeline_with(
    group: localsgd_comm::Group,
    spec: AlgorithmSpec,
    optimizer: burn::optim::ModuleOptimizer,
    opts: PipelineOptions,
) -> Pipeline<Mlp> {
    let parts = build(&spec, &group).unwrap();
    Pipeline::new(group, optimizer, opts).with_parts(parts)
}

#[test]
fn phases_run_in_the_fixed_order_and_only_communicating_phases_communicate() {
    let d = data();
    let logs = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let device = Device::flex().autodiff();
            let log = Arc::new(Mutex::new(Vec::new()));
            let sink = log.clone();
            let opts = PipelineOptions {
                metrics_every: 1,
                ..Default::default()
            };
            let mut p = pipeline(g.clone(), AlgorithmKind::PostLocalSgd, opts).with_observer(
                Box::new(move |phase, n| sink.lock().unwrap().push((phase, n))),
            );
            let mut src = IterSource(batches(&d, g.rank(), 4, &device).into_iter());
            let mut m = model(&device);
            for _ in 0..4 {
                match p.run_iteration(m, &mut src, &loss).unwrap() {
                    Outcome::Trained(next, _) => m = next,
                    Outcome::EndOfData(_) => panic!("data ran out early"),
                }
            }
            log.lock().unwrap().clone()
        })
        .unwrap();
    for log in logs {
        assert_eq!(log.len(), 4 * ITERATION_ORDER.len());
        for (i, (phase, collectives)) in log.iter().enumerate() {
            assert_eq!(*phase, ITERATION_ORDER[i % ITERATION_ORDER.len()]);
            if !phase.communicates() {
                assert_eq!(*collectives, 0, "{phase} communicated");
            }
            if *phase == Phase::AgreeHasData || *phase == Phase::Metrics {
                assert_eq!(*collectives, 1, "{phase}");
            }
        }
        // Warmup 2, period 2: averaging (layout check + fused all-reduce) at steps 2 only... and
        // gradient sync in every iteration.
        let averaging: Vec<u64> = log
            .iter()
            .filter(|(p, _)| *p == Phase::ModelAveraging)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(
            averaging.iter().map(|&n| n > 0).collect::<Vec<_>>(),
            vec![false, false, true, false]
        );
        assert!(
            log.iter()
                .filter(|(p, _)| *p == Phase::GradientSync)
                .all(|(_, n)| *n > 0)
        );
    }
}

struct Counted {
    left: usize,
    batch: Batch,
}

impl BatchSource<Batch> for Counted {
    fn next_batch(&mut self) -> Result<Option<Batch>, SourceError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        Ok(Some(self.batch.clone()))
    }
}

#[test]
fn uneven_shards_end_the_epoch_together() {
    let d = data();
    let out = ThreadWorld::new(3)
        .unwrap()
        .run(|g| {
            let device = Device::flex().autodiff();
            let mut p = pipeline(g.clone(), AlgorithmKind::Ddp, PipelineOptions::default());
            // Ranks hold 5, 3 and 4 batches: everyone stops after 3 iterations.
            let mut src = Counted {
                left: [5, 3, 4][g.rank()],
                batch: batches(&d, g.rank(), 1, &device).remove(0),
            };
            let mut m = model(&device);
            loop {
                match p.run_iteration(m, &mut src, &loss).unwrap() {
                    Outcome::Trained(next, _) => m = next,
                    Outcome::EndOfData(_) => return (p.iteration(), src.left),
                }
            }
        })
        .unwrap();
    assert_eq!(out, vec![(3, 1), (3, 0), (3, 0)]);
}

/// A source whose third read fails on rank 1.
struct Failing {
    reads: usize,
    rank: usize,
    batch: Batch,
}

impl BatchSource<Batch> for Failing {
    fn next_batch(&mut self) -> Result<Option<Batch>, SourceError> {
        self.reads += 1;
        if self.rank == 1 && self.reads == 3 {
            return Err("shard file truncated at byte 4096".into());
        }
        Ok(Some(self.batch.clone()))
    }
}

#[test]
fn a_source_error_stops_its_rank_and_is_not_the_end_of_the_epoch() {
    let d = data();
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let device = Device::flex().autodiff();
            let mut p = pipeline(g.clone(), AlgorithmKind::Ddp, PipelineOptions::default());
            let mut src = Failing {
                reads: 0,
                rank: g.rank(),
                batch: batches(&d, g.rank(), 1, &device).remove(0),
            };
            let mut m = model(&device);
            loop {
                match p.run_iteration(m, &mut src, &loss) {
                    Ok(Outcome::Trained(next, _)) => m = next,
                    Ok(Outcome::EndOfData(_)) => return Ok(p.iteration()),
                    Err(e) => return Err((p.iteration(), e)),
                }
            }
        })
        .unwrap();
    // Rank 1 fails in its third iteration's fetch with the source's error...
    match &out[1] {
        Err((2, e @ PipelineError::Data(_))) => {
            assert_eq!(
                e.to_string(),
                "reading the next batch: shard file truncated at byte 4096"
            );
        }
        other => panic!("rank 1: {other:?}"),
    }
    // ...and rank 0 does not end the epoch quietly: its next collective fails.
    assert!(
        matches!(&out[0], Err((2, PipelineError::Comm { .. }))),
        "rank 0: {:?}",
        out[0]
    );
}

#[test]
fn metrics_phase_reports_the_mean_loss_of_all_ranks() {
    let d = data();
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let device = Device::flex().autodiff();
            let opts = PipelineOptions {
                metrics_every: 2,
                ..Default::default()
            };
            let mut p = pipeline(g.clone(), AlgorithmKind::LocalSgd, opts);
            let mut src = IterSource(batches(&d, g.rank(), 2, &device).into_iter());
            let mut m = model(&device);
            let mut reports = Vec::new();
            for _ in 0..2 {
                if let Outcome::Trained(next, r) = p.run_iteration(m, &mut src, &loss).unwrap() {
                    m = next;
                    reports.push((r.loss, r.global_loss));
                } else {
                    panic!("no data");
                }
            }
            reports
        })
        .unwrap();
    assert_eq!(out[0][0].1, None, "iteration 0 is not a metrics iteration");
    let mean = (out[0][1].0 as f64 + out[1][1].0 as f64) / 2.0;
    for r in &out {
        let g = r[1].1.unwrap();
        assert!((g - mean).abs() < 1e-6, "{g} vs {mean}");
    }
}

#[test]
fn skipped_optimizer_step_still_runs_averaging_so_counters_stay_aligned() {
    let d = data();
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let device = Device::flex().autodiff();
            let opts = PipelineOptions {
                skip_non_finite: true,
                ..Default::default()
            };
            let mut p = pipeline(g.clone(), AlgorithmKind::LocalSgd, opts);
            let rank = g.rank();
            let calls = Mutex::new(0usize);
            // Rank 1's loss is NaN in iteration 1: its gradients are not finite.
            let nan_loss = |m: &Mlp, b: &Batch| {
                let mut c = calls.lock().unwrap();
                *c += 1;
                let l = loss(m, b);
                if rank == 1 && *c == 2 {
                    l * f32::NAN
                } else {
                    l
                }
            };
            let mut src = IterSource(batches(&d, rank, 6, &device).into_iter());
            let mut m = model(&device);
            let mut skipped = Vec::new();
            for _ in 0..6 {
                match p.run_iteration(m, &mut src, &nan_loss).unwrap() {
                    Outcome::Trained(next, r) => {
                        m = next;
                        skipped.push(r.skipped_step);
                    }
                    Outcome::EndOfData(_) => panic!("no data"),
                }
            }
            let w: Vec<f32> = m.layers[0].weight.val().into_data().try_into_vec().unwrap();
            (p.skipped_steps(), p.averager().unwrap().step(), skipped, w)
        })
        .unwrap();
    assert_eq!(out[0].0, 0);
    assert_eq!(out[1].0, 1);
    assert_eq!(out[1].2, vec![false, true, false, false, false, false]);
    // Both averagers counted all 6 iterations.
    assert_eq!(out[0].1, 6);
    assert_eq!(out[1].1, 6);
    // Warmup 2, period 2: averaged at steps 2 and 4; not at 5, so the models differ by one
    // local step but stay finite.
    assert!(out[1].3.iter().all(|x| x.is_finite()));
}

#[test]
fn checkpoint_phase_runs_every_n_iterations() {
    let d = data();
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            let device = Device::flex().autodiff();
            let opts = PipelineOptions {
                checkpoint_every: 3,
                ..Default::default()
            };
            let seen = Arc::new(Mutex::new(Vec::new()));
            let sink = seen.clone();
            let mut p = pipeline(g.clone(), AlgorithmKind::PostLocalSgd, opts).with_checkpointer(
                Box::new(move |ctx| {
                    ctx.group.barrier().unwrap();
                    sink.lock()
                        .unwrap()
                        .push((ctx.iterations_done, ctx.averager.as_ref().map(|a| a.step)));
                    Ok(())
                }),
            );
            let mut src = IterSource(batches(&d, g.rank(), 7, &device).into_iter());
            let mut m = model(&device);
            for _ in 0..7 {
                match p.run_iteration(m, &mut src, &loss).unwrap() {
                    Outcome::Trained(next, _) => m = next,
                    Outcome::EndOfData(_) => panic!("no data"),
                }
            }
            seen.lock().unwrap().clone()
        })
        .unwrap();
    for v in out {
        assert_eq!(v, vec![(3, Some(3)), (6, Some(6))]);
    }
}

#[test]
fn post_local_sgd_without_a_period_is_an_error_naming_it() {
    let out = ThreadWorld::new(1)
        .unwrap()
        .run(|g| {
            let mut s = spec(AlgorithmKind::PostLocalSgd);
            s.period = None;
            build(&s, &g).err().map(|e| e.to_string())
        })
        .unwrap();
    let msg = out[0].clone().unwrap();
    assert!(
        msg.contains("Post-localSGD algorithm is used, but model averaging period is not provided"),
        "{msg}"
    );
    assert!(msg.contains("period"), "{msg}");
}

/// Pipelined gradient sync (the default) gives the blocking pipeline's parameters to the bit,
/// issues the same collectives in the same phases, and books its waits as gradient-sync time.
#[test]
fn pipelined_gradient_sync_matches_blocking_in_the_pipeline() {
    let d = data();
    for kind in [AlgorithmKind::Ddp, AlgorithmKind::PostLocalSgd] {
        let out = ThreadWorld::new(2)
            .unwrap()
            .run(|g| {
                let mut runs = Vec::new();
                for pipelined in [false, true] {
                    let device = Device::flex().autodiff();
                    let log = Arc::new(Mutex::new(Vec::new()));
                    let sink = log.clone();
                    let momentum = burn::optim::momentum::MomentumConfig {
                        momentum: 0.9,
                        dampening: 0.0,
                        nesterov: false,
                    };
                    let optim = burn::optim::SgdConfig::new()
                        .with_momentum(Some(momentum))
                        .init();
                    let mut p = pipeline_with(
                        g.clone(),
                        pipelined_spec(kind, pipelined),
                        optim,
                        PipelineOptions::default(),
                    )
                    .with_observer(Box::new(move |phase, n| {
                        sink.lock().unwrap().push((phase, n))
                    }));
                    let mut src = IterSource(batches(&d, g.rank(), 5, &device).into_iter());
                    let mut m = model(&device);
                    for _ in 0..5 {
                        match p.run_iteration(m, &mut src, &loss).unwrap() {
                            Outcome::Trained(next, _) => m = next,
                            Outcome::EndOfData(_) => panic!("data ran out early"),
                        }
                    }
                    let m = p.finish(m).unwrap();
                    let flat = localsgd_comm::params::flatten_params(
                        &m,
                        &localsgd_comm::params::ParamSelection::All,
                    )
                    .unwrap();
                    let log = log.lock().unwrap().clone();
                    runs.push((flat.buffer, log));
                }
                runs
            })
            .unwrap();
        let before = localsgd_comm::params::flatten_params(
            &model(&Device::flex().autodiff()),
            &localsgd_comm::params::ParamSelection::All,
        )
        .unwrap()
        .buffer;
        for (rank, runs) in out.iter().enumerate() {
            assert_ne!(
                runs[0].0, before,
                "{kind:?}: training must move the parameters"
            );
            assert_eq!(
                runs[0].0, runs[1].0,
                "{kind:?} rank {rank}: parameters differ"
            );
            // The same collectives in the same phases, except the one that creates the
            // non-blocking group: at the first pipelined iteration, and for post-local SGD
            // again at its switch to the subgroup (warmup 2).
            let (blocking, pipelined) = (&runs[0].1, &runs[1].1);
            assert_eq!(blocking.len(), pipelined.len());
            let mut extra = Vec::new();
            for ((pb, nb), (pp, np)) in blocking.iter().zip(pipelined) {
                assert_eq!(pb, pp);
                if *pb == Phase::GradientSync {
                    extra.push(np - nb);
                } else {
                    assert_eq!(nb, np, "{kind:?} rank {rank}: {pb} collectives differ");
                }
            }
            let want = match kind {
                AlgorithmKind::Ddp => vec![1, 0, 0, 0, 0],
                _ => vec![1, 0, 1, 0, 0],
            };
            assert_eq!(extra, want, "{kind:?} rank {rank}");
        }
        assert_eq!(out[0][1].0, out[1][1].0, "{kind:?}: ranks differ");
    }
}
