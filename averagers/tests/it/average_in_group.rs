//! Section 1: `average_in_group` on real burn modules — vectors V1–V4 (semantics §10), one fused all-reduce,
//! any module shape, ids/dtypes kept.

use crate::common;

use burn::prelude::*;
use burn::tensor::DType;
use common::*;
use localsgd_averagers::comm::{ThreadWorld, Traffic};
use localsgd_averagers::{ParamSelection, average_if_member, average_in_group, new_group};

#[test]
fn v1_world_average_of_equal_values_is_unchanged() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let m = fill(Three::new(&device), 1.0);
            let m = average_in_group(m, &ParamSelection::All, &world).unwrap();
            param_values(&m)
        })
        .unwrap();
    for rank in out {
        assert!(rank.iter().flatten().all(|&x| x == 1.0), "{rank:?}");
    }
}

#[test]
fn v2_average_in_subgroup_leaves_non_members_unchanged() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let sub = new_group(&world, &[0, 1]).unwrap();
            let m = fill(Three::new(&device), world.rank() as f64);
            let before = world.traffic();
            let m = average_if_member(m, &ParamSelection::All, sub.as_ref()).unwrap();
            let sent = (world.traffic() - before).collectives;
            (
                param_values(&m),
                sub.map(|g| g.world_ranks().to_vec()),
                sent,
            )
        })
        .unwrap();
    let expected = [0.5, 0.5, 2.0, 3.0];
    for (rank, (vals, members, sent)) in out.into_iter().enumerate() {
        assert!(
            vals.iter().flatten().all(|&x| x == expected[rank]),
            "rank {rank}: {vals:?}"
        );
        if rank < 2 {
            assert_eq!(members, Some(vec![0, 1]));
            assert_eq!(sent, 2, "agreement all-gather + one all-reduce");
        } else {
            assert_eq!(members, None);
            assert_eq!(sent, 0, "non-members do not communicate");
        }
    }
}

#[test]
fn new_group_rejects_bad_members() {
    let g = lone_handle(4);
    for (members, needle) in [
        (vec![], "at least one member"),
        (vec![0, 4], "rank 4 is not in 0..4"),
        (vec![1, 1], "rank 1 is listed twice"),
    ] {
        let err = new_group(&g, &members).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
        assert!(err.contains(&format!("{members:?}")), "{err}");
    }
}

#[test]
fn v3_f32_and_f64_parameters_average_to_1_6() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let v = world.rank() as f64 + 0.1;
            let m32 = fill(Three::new(&device), v);
            let m32 = average_in_group(m32, &ParamSelection::All, &world).unwrap();
            let m64 = fill(cast(Three::new(&device), DType::F64), v);
            let m64 = average_in_group(m64, &ParamSelection::All, &world).unwrap();
            let dtypes: Vec<DType> = param_meta(&m64).iter().map(|m| m.1).collect();
            (param_values(&m32), param_values(&m64), dtypes)
        })
        .unwrap();
    for (v32, v64, dtypes) in out {
        assert!(dtypes.iter().all(|d| *d == DType::F64), "{dtypes:?}");
        // f32: 1.6 within float rounding.
        assert!(
            v32.iter().flatten().all(|&x| (x - 1.6).abs() < 3e-7),
            "{v32:?}"
        );
        // f64: exactly the reference's 1.6 (divide by 4 first, then sum).
        assert!(v64.iter().flatten().all(|&x| x == 1.6), "{v64:?}");
    }
}

#[test]
fn v4_only_parameters_with_gradients_are_averaged() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let m = fill(Three::new(&device), world.rank() as f64);
            let sel = ParamSelection::ids([m.p1.id, m.p3.id]);
            let m = average_in_group(m, &sel, &world).unwrap();
            param_values(&m)
        })
        .unwrap();
    for (rank, vals) in out.into_iter().enumerate() {
        assert!(vals[0].iter().all(|&x| x == 1.5), "p1 {vals:?}");
        assert!(vals[1].iter().all(|&x| x == rank as f64), "p2 {vals:?}");
        assert!(vals[2].iter().all(|&x| x == 1.5), "p3 {vals:?}");
    }
}

#[test]
fn one_fused_all_reduce_per_call_carrying_only_selected_params() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let m = fill(Three::new(&device), world.rank() as f64);
            let sel = ParamSelection::ids([m.p1.id, m.p3.id]);
            let before = world.traffic();
            let _ = average_in_group(m, &sel, &world).unwrap();
            world.traffic() - before
        })
        .unwrap();
    // One all-gather of 4 u64 words (agreement check) + one all-reduce of 3 + 2 f32 elements;
    // on the wire of 4 ranks a ring all-gather moves 3 of the 32-byte vectors, a ring
    // all-reduce 2 · 3/4 of the 20 bytes.
    for t in out {
        assert_eq!(
            t,
            Traffic {
                collectives: 2,
                bytes: 4 * 8 + 5 * 4,
                data_bytes: 5 * 4,
                wire_bytes: 3 * 32 + 2 * 3 * 20 / 4,
            }
        );
    }
}

#[test]
fn empty_selection_is_a_no_op_without_communication() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let m = fill(Three::new(&device), world.rank() as f64);
            let before = world.traffic();
            let m = average_in_group(m, &ParamSelection::ids([]), &world).unwrap();
            (param_values(&m), world.traffic() - before)
        })
        .unwrap();
    for (rank, (vals, traffic)) in out.into_iter().enumerate() {
        assert!(vals.iter().flatten().all(|&x| x == rank as f64));
        assert_eq!(traffic, Traffic::default());
    }
}

fn check_module_average<M: burn::module::Module>(make: impl Fn(&Device) -> M + Sync) {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex().autodiff();
            let m = fill(make(&device), world.rank() as f64);
            let meta = param_meta(&m);
            let m = average_in_group(m, &ParamSelection::All, &world).unwrap();
            (
                meta == param_meta(&m),
                all_equal(&m, 1.5),
                param_meta(&m).len(),
            )
        })
        .unwrap();
    for (kept, averaged, n) in out {
        assert!(kept, "ParamIds, dtypes and require_grad survive");
        assert!(averaged, "every parameter is the mean 1.5");
        assert!(n > 0);
    }
}

#[test]
fn averages_mlps_conv_nets_and_nested_modules() {
    check_module_average(Mlp::new);
    check_module_average(ConvNet::new);
    check_module_average(Nested::new);
}
