//! The seed's race, reproduced: averaging inside the optimizer step while a data-loader thread
//! all-reduces an "is there more data?" flag on the same group. Ranks interleave the two
//! collectives differently; the comm layer reports the mismatch on every rank instead of hanging
//! or mixing buffers. The pipeline, with the same ingredients as phases, runs clean.

use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, Int, Tensor};
use localsgd_averagers::{AverageParameters, PeriodicModelAverager};
use localsgd_comm::params::ParamSelection;
use localsgd_comm::{CommError, GroupExt, ThreadWorld};
use localsgd_models::data::synthetic;
use localsgd_models::mlp::{Mlp, MlpConfig};
use localsgd_models::network::loss;
use localsgd_pipeline::pipeline::{IterSource, Outcome, Pipeline, PipelineOptions};
use std::time::Duration;

type Batch = (Tensor<2>, Tensor<1, Int>);

fn setup(rank: usize, device: &Device) -> (Mlp, Vec<Batch>) {
    let data = synthetic::generate(32, 4, 3, 1).unwrap();
    let model = MlpConfig {
        input: 4,
        hidden: vec![5],
        classes: 3,
    }
    .init(9, device)
    .unwrap();
    let batches = (0..3)
        .map(|i| {
            let idx: Vec<usize> = (0..4).map(|j| (rank * 16 + i * 4 + j) % 32).collect();
            data.batch_tensors(&idx, device).unwrap()
        })
        .collect();
    (model, batches)
}

#[test]
fn averaging_inside_the_optimizer_step_races_with_the_loader_and_is_reported() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .with_timeout(Duration::from_secs(20))
        .run(|g| {
            let device = Device::flex().autodiff();
            let (model, batches) = setup(g.rank(), &device);
            let mut optim = SgdConfig::new().init();
            let mut averager = PeriodicModelAverager::new(1, 0, g.clone()).unwrap();
            // "PostLocalSGDOptimizer.step()": inner step, then averaging, in one call.
            let mut averaging_step = |model: Mlp| {
                let l = loss(&model, &batches[0]);
                let grads = GradientsParams::from_grads(l.backward(), &model);
                let sel = ParamSelection::with_grads(&model, &grads);
                let model = optim.step(0.1, model, grads);
                averager.average_parameters(model, &sel).map(|_| ())
            };
            let loader_group = g.clone();
            let loader = move || loader_group.all_true(true).map(|_| ());
            let (step, flag) = if g.rank() == 0 {
                // Rank 0's loader asks "more data?" before the optimizer step averages.
                let t = std::thread::spawn(loader);
                std::thread::sleep(Duration::from_millis(100));
                let step = averaging_step(model);
                (step, t.join().unwrap())
            } else {
                // Rank 1 steps (and averages) first; its loader asks afterwards.
                let t = std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(100));
                    loader()
                });
                let step = averaging_step(model);
                (step, t.join().unwrap())
            };
            (step.map_err(|e| e.to_string()), flag)
        })
        .unwrap();
    for (rank, (step, flag)) in out.into_iter().enumerate() {
        let step = step.expect_err("the averaging collective must not succeed");
        assert!(step.contains("collective mismatch"), "rank {rank}: {step}");
        assert!(
            step.contains("rank 0 called") && step.contains("rank 1 called"),
            "{step}"
        );
        assert!(
            matches!(flag, Err(CommError::Mismatch { .. })),
            "rank {rank}: loader got {flag:?}"
        );
    }
}

#[test]
fn the_pipeline_with_the_same_ingredients_runs_clean() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .with_timeout(Duration::from_secs(20))
        .run(|g| {
            let device = Device::flex().autodiff();
            let (mut model, batches) = setup(g.rank(), &device);
            let averager = PeriodicModelAverager::new(1, 0, g.clone()).unwrap();
            let mut p = Pipeline::new(
                g.clone(),
                SgdConfig::new().init(),
                PipelineOptions::default(),
            )
            .with_averager(Box::new(averager));
            let mut src = IterSource(batches.into_iter());
            loop {
                match p.run_iteration(model, &mut src, &loss).unwrap() {
                    Outcome::Trained(m, _) => model = m,
                    Outcome::EndOfData(m) => {
                        model = m;
                        break;
                    }
                }
            }
            let w: Vec<f32> = model.layers[0]
                .weight
                .val()
                .into_data()
                .try_into_vec()
                .unwrap();
            (p.iteration(), w)
        })
        .unwrap();
    assert_eq!(out[0].0, 3);
    assert_eq!(out[1].0, 3);
    // Averaged after every step: both ranks hold the same model.
    assert_eq!(out[0].1, out[1].1);
}
