//! Streaming DiLoCo against the outer-optimizer vector V8 (semantics §10, the per-event data
//! of its numpy oracle, which matches the real torchft to 6.7e-16, copied to
//! `tests/data/outer_v8.json`): 4 replicas, a coordinate `a` with target `r` and `b` with target
//! `2r`, fragments `[a]` and `[b]`, `sync_every` 4, Nesterov(0.7, 0.9) per fragment, inner SGD
//! lr 0.1, `w0 = 1`; plus E8, torchft's shared-optimizer hazard as an anti-test, the
//! validation, and a checkpoint taken while a delayed pseudo-gradient is in flight.

use burn::module::{Module, Param};
use burn::prelude::*;
use burn::tensor::DType;
use localsgd_averagers::comm::ThreadWorld;
use localsgd_averagers::comm::params::{FlatBuffer, ParamSelection, flatten_params, write_params};
use localsgd_averagers::outer::StreamingConfig;
use localsgd_averagers::{
    AverageParameters, AveragerError, ModelAverager, OuterAverager, OuterSgdConfig, OuterState,
};

#[derive(Module, Debug)]
struct Pair {
    a: Param<Tensor<1>>,
    b: Param<Tensor<1>>,
}

fn pair(a: f64, b: f64) -> Pair {
    let device = Device::flex();
    let t = |v: f64| Tensor::<1>::from_data(TensorData::from([v]), (&device, DType::F64));
    Pair {
        a: Param::from_tensor(t(a)),
        b: Param::from_tensor(t(b)),
    }
}

fn values(m: &Pair) -> [f64; 2] {
    match flatten_params(m, &ParamSelection::All)
        .expect("flatten")
        .buffer
    {
        FlatBuffer::F64(v) => [v[0], v[1]],
        other => panic!("expected f64, got {other:?}"),
    }
}

/// One inner SGD step, lr 0.1: `a` towards `r`, `b` towards `2r`.
fn inner_step(m: Pair, r: f64) -> Pair {
    let mut flat = flatten_params(&m, &ParamSelection::All).expect("flatten");
    if let FlatBuffer::F64(v) = &mut flat.buffer {
        v[0] -= 0.1 * (v[0] - r);
        v[1] -= 0.1 * (v[1] - 2.0 * r);
    }
    write_params(m, &flat).expect("write")
}

/// A perform event: (1-based step, fragment, θ_f, every replica's (a, b)).
#[derive(Debug, Clone, PartialEq)]
struct Event {
    step: u64,
    fragment: usize,
    theta: f64,
    replicas: Vec<[f64; 2]>,
}

fn streaming(delay: u64, alpha: f64) -> StreamingConfig {
    StreamingConfig::new(4, 2)
        .with_delay(delay)
        .with_alpha(alpha)
}

/// `steps` inner steps on 4 ranks under Streaming DiLoCo; the events where an outer step ran.
/// `stop_at`: after that many steps every rank saves its state and continues with a freshly
/// built averager restored from it.
fn run(config: StreamingConfig, steps: u64, stop_at: Option<u64>) -> Vec<Event> {
    let build = move |world| {
        OuterAverager::streaming(config, 0, OuterSgdConfig::diloco(), world).expect("averager")
    };
    let per_rank = ThreadWorld::new(4)
        .expect("world")
        .run(|world| {
            let r = world.rank() as f64;
            let mut averager = build(world.clone());
            let mut model = pair(1.0, 1.0);
            averager
                .reset_global(&model, &ParamSelection::All)
                .expect("θ");
            let mut events = Vec::new();
            for s in 1..=steps {
                model = inner_step(model, r);
                let before = averager.outer_steps();
                model = averager
                    .average_parameters(model, &ParamSelection::All)
                    .expect("average");
                if averager.outer_steps() > before {
                    let f = ((averager.outer_steps() - 1) % 2) as usize;
                    let theta = match averager.fragment_params(f) {
                        Some(FlatBuffer::F64(v)) => v[0],
                        other => panic!("θ_{f}: {other:?}"),
                    };
                    events.push((s, f, theta, values(&model)));
                }
                if stop_at == Some(s) {
                    let saved_step = averager.state();
                    let saved = averager
                        .global_state()
                        .expect("settled")
                        .expect("θ taken")
                        .to_bytes();
                    averager.finish().expect("finish");
                    averager = build(world.clone());
                    averager.load_state(&saved_step).expect("step");
                    averager
                        .load_global_state(&OuterState::from_bytes(&saved).expect("decode"))
                        .expect("restore");
                }
            }
            averager.finish().expect("finish");
            events
        })
        .expect("run");
    (0..per_rank[0].len())
        .map(|k| {
            let (step, fragment, theta, _) = per_rank[0][k];
            for r in &per_rank {
                assert_eq!(
                    (r[k].0, r[k].1, r[k].2),
                    (step, fragment, theta),
                    "θ agrees"
                );
            }
            Event {
                step,
                fragment,
                theta,
                replicas: per_rank.iter().map(|r| r[k].3).collect(),
            }
        })
        .collect()
}

fn expected(case: &str) -> Vec<Event> {
    let text = include_str!("../data/outer_v8.json");
    let json: serde_json::Value = serde_json::from_str(text).expect("json");
    json["V8_streaming_S4_F2"][case]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| Event {
            step: e["step"].as_u64().expect("step"),
            fragment: e["fragment"].as_u64().expect("fragment") as usize,
            theta: e["global_fragment"][0].as_f64().expect("θ"),
            replicas: e["replicas"]
                .as_array()
                .expect("replicas")
                .iter()
                .map(|r| [r[0].as_f64().expect("a"), r[1].as_f64().expect("b")])
                .collect(),
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

fn assert_events(got: &[Event], want: &[Event], case: &str) {
    assert_eq!(got.len(), want.len(), "{case}: events {got:?}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.step, g.fragment), (w.step, w.fragment), "{case}");
        assert!(
            close(g.theta, w.theta),
            "{case} step {}: θ {} vs {}",
            g.step,
            g.theta,
            w.theta
        );
        for (r, (gr, wr)) in g.replicas.iter().zip(&w.replicas).enumerate() {
            assert!(
                close(gr[0], wr[0]) && close(gr[1], wr[1]),
                "{case} step {} replica {r}: {gr:?} vs {wr:?}",
                g.step
            );
        }
    }
}

#[test]
fn v8_fragments_synced_in_turn_with_delay_and_mixing() {
    for (case, delay, alpha) in [
        ("tau0_alpha0.0", 0, 0.0),
        ("tau1_alpha0.0", 1, 0.0),
        ("tau1_alpha0.5", 1, 0.5),
    ] {
        let got = run(streaming(delay, alpha), 12, None);
        assert_events(&got, &expected(case), case);
    }
}

/// torchft's `train_diloco.py` hands one outer optimizer to all fragments; inside the inner
/// optimizer's post-hook the other fragments still hold their inner gradients, so they take a
/// raw outer step too (semantics §8.5). The real torchft then ends at θ = (0.7461572195,
/// −2.2099003105), and replica 3's b jumps to 7.935 at step 2. One state per fragment must not.
#[test]
fn the_shared_outer_optimizer_hazard_is_not_reproduced() {
    let got = run(streaming(1, 0.5), 12, None);
    let step2 = &got[0];
    assert!(close(step2.replicas[3][1], 1.95), "{step2:?}");
    let last_a = got.iter().rev().find(|e| e.fragment == 0).expect("a").theta;
    let last_b = got.iter().rev().find(|e| e.fragment == 1).expect("b").theta;
    assert!((last_a - 0.7461572195).abs() > 0.1, "{last_a}");
    assert!((last_b - -2.2099003105).abs() > 1.0, "{last_b}");
    assert!(close(last_b, 2.9726457347550133), "{last_b}");
}

/// A checkpoint after step 5 (fragment a's pseudo-gradient was started at step 5 and is
/// applied at step 6, τ = 1) carries the pending average; the restored run equals the
/// uninterrupted one bit for bit.
#[test]
fn a_checkpoint_between_prepare_and_perform_resumes_bitwise() {
    for stop in [5, 6] {
        let straight = run(streaming(1, 0.5), 12, None);
        let resumed = run(streaming(1, 0.5), 12, Some(stop));
        assert_eq!(straight, resumed, "stopped after step {stop}");
    }
}

/// E8: one fragment, no delay, no mixing is DiLoCo, bit for bit.
#[test]
fn e8_one_fragment_without_delay_or_mixing_is_diloco() {
    let run_with = |streaming: bool| {
        ThreadWorld::new(4)
            .expect("world")
            .run(|world| {
                let r = world.rank() as f64;
                let mut averager = if streaming {
                    OuterAverager::streaming(
                        StreamingConfig::new(3, 1),
                        0,
                        OuterSgdConfig::diloco(),
                        world.clone(),
                    )
                } else {
                    OuterAverager::periodic(3, 0, OuterSgdConfig::diloco().into(), world.clone())
                }
                .expect("averager");
                let mut model = pair(1.0, 0.5);
                averager
                    .reset_global(&model, &ParamSelection::All)
                    .expect("θ");
                let mut trace = Vec::new();
                for _ in 0..14 {
                    model = inner_step(model, r);
                    model = averager
                        .average_parameters(model, &ParamSelection::All)
                        .expect("average");
                    trace.push(values(&model).map(f64::to_bits));
                }
                trace
            })
            .expect("run")
    };
    let (streamed, plain) = (run_with(true), run_with(false));
    assert_eq!(streamed, plain);
    // Syncs happened: the replicas agree right after one (step 3) and differ between.
    assert_eq!(streamed[0][2], streamed[3][2]);
    assert_ne!(streamed[0][3], streamed[3][3]);
}

fn refused(config: StreamingConfig) -> String {
    ThreadWorld::new(1)
        .expect("world")
        .run(|w| {
            OuterAverager::streaming(config, 0, OuterSgdConfig::diloco(), w)
                .map(|_| ())
                .map_err(|e: AveragerError| e.to_string())
        })
        .expect("run")
        .remove(0)
        .expect_err("refused")
}

/// torchft's checks, in its order, with its messages (typos included).
#[test]
fn invalid_streaming_settings_are_refused_with_torchfts_messages() {
    let e = refused(StreamingConfig::new(4, 0));
    assert!(e.contains("fragments 0"), "{e}");
    let e = refused(StreamingConfig::new(2, 3));
    assert!(
        e.contains("Only 1 fragment can be syncrhonized at a time") && e.contains("sync_every 2"),
        "{e}"
    );
    let e = refused(StreamingConfig::new(5, 2));
    assert!(
        e.contains("sync_every must divide the number of fragments"),
        "{e}"
    );
    let e = refused(StreamingConfig::new(4, 2).with_delay(2));
    assert!(
        e.contains("Fragment must be synced before it is reduced another time")
            && e.contains("valid: 0 to 1"),
        "{e}"
    );
    let e = refused(StreamingConfig::new(4, 2).with_alpha(1.5));
    assert!(
        e.contains("fragment_update_alpha must be between 0 and 1"),
        "{e}"
    );
    // More fragments than parameter tensors: refused when θ is taken.
    let e = ThreadWorld::new(1)
        .expect("world")
        .run(|w| {
            let mut a = OuterAverager::streaming(
                StreamingConfig::new(6, 3),
                0,
                OuterSgdConfig::diloco(),
                w,
            )
            .expect("averager");
            a.reset_global(&pair(1.0, 1.0), &ParamSelection::All)
                .map_err(|e| e.to_string())
        })
        .expect("run")
        .remove(0)
        .expect_err("3 fragments of 2 tensors");
    assert!(e.contains("at most 2 fragments"), "{e}");
}

/// E9 (boundary case): with α = 1 every replica keeps its own fragment values through the
/// outer step, while θ_f still moves (and is never adopted): the run equals plain local SGD
/// and θ equals the α = 0 run's.
#[test]
fn e9_alpha_one_keeps_the_local_values_and_theta_still_moves() {
    let kept = run(streaming(0, 1.0), 12, None);
    // Local SGD alone from w0 = 1: a → r, b → 2r with lr 0.1 for 12 steps on every replica.
    for e in &kept {
        for (r, got) in e.replicas.iter().enumerate() {
            let local = |target: f64| target + (1.0 - target) * 0.9f64.powi(e.step as i32);
            let want = [local(r as f64), local(2.0 * r as f64)];
            assert!(
                close(got[0], want[0]) && close(got[1], want[1]),
                "step {} replica {r}: {got:?} vs local SGD {want:?}",
                e.step
            );
        }
    }
    // θ_a's first outer step sees the same pseudo-gradient as with α = 0 (V8's first event).
    let adopted = expected("tau0_alpha0.0");
    assert!(close(kept[0].theta, adopted[0].theta), "{:?}", kept[0]);
    assert!(kept.iter().all(|e| e.theta != 1.0), "θ moves");
}
