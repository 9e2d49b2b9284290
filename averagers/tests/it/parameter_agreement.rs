//! Deliberate difference 4: ranks that select different parameter sets get a clear error naming
//! the ranks, on every rank, instead of a hang or a wrong average.

use crate::common;

use burn::prelude::*;
use burn::tensor::DType;
use common::*;
use localsgd_averagers::comm::{CommError, ThreadWorld};
use localsgd_averagers::{AveragerError, ParamSelection, RankParams, average_in_group};

#[test]
fn different_parameter_counts_name_each_rank() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let m = Three::new(&device);
            // Rank 2 forgot p3.
            let sel = if world.rank() == 2 {
                ParamSelection::ids([m.p1.id])
            } else {
                ParamSelection::ids([m.p1.id, m.p3.id])
            };
            average_in_group(m, &sel, &world).map(|_| ()).unwrap_err()
        })
        .unwrap();
    for err in out {
        let AveragerError::ParameterSetMismatch { group, ranks } = &err else {
            panic!("unexpected error {err}");
        };
        assert_eq!(group, &vec![0, 1, 2, 3]);
        let counts: Vec<(usize, u64, u64)> = ranks
            .iter()
            .map(|r| (r.rank, r.params, r.elements))
            .collect();
        assert_eq!(counts, vec![(0, 2, 5), (1, 2, 5), (2, 1, 3), (3, 2, 5)]);
        let msg = err.to_string();
        assert!(
            msg.contains("rank 2 has 1 parameter tensor(s) with 3 f32 element(s)"),
            "{msg}"
        );
        assert!(
            msg.contains("rank 0 has 2 parameter tensor(s) with 5"),
            "{msg}"
        );
    }
}

#[test]
fn same_counts_and_sizes_at_different_positions_are_detected() {
    // Two modules whose selected tensors have identical counts and sizes but different traversal
    // positions (fingerprints differ).
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let m = Nested::new(&device);
            let ids = param_ids(&m);
            // blocks[0].fc1.bias (index 1) and blocks[1].fc1.bias (index 5) both have 5 elements.
            let pick = if world.rank() == 0 { ids[1] } else { ids[5] };
            average_in_group(m, &ParamSelection::ids([pick]), &world)
                .map(|_| ())
                .unwrap_err()
        })
        .unwrap();
    for err in out {
        let AveragerError::ParameterSetMismatch { ranks, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!(ranks[0].elements, ranks[1].elements);
        assert_ne!(ranks[0].fingerprint, ranks[1].fingerprint);
        assert!(err.to_string().contains("layout"), "{err}");
    }
}

#[test]
fn mixed_element_types_are_detected() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            let device = Device::flex();
            let m = Three::new(&device);
            let m = if world.rank() == 1 {
                cast(m, DType::F64)
            } else {
                m
            };
            average_in_group(m, &ParamSelection::All, &world)
                .map(|_| ())
                .unwrap_err()
        })
        .unwrap();
    for err in out {
        let AveragerError::ParameterSetMismatch { ranks, .. } = &err else {
            panic!("{err}")
        };
        let types: Vec<&str> = ranks.iter().map(|r: &RankParams| r.element_type).collect();
        assert_eq!(types, vec!["f32", "f64"]);
    }
}

#[test]
fn a_rank_that_selects_nothing_makes_its_peers_fail_naming_it() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .with_timeout(std::time::Duration::from_millis(300))
        .run(|world| {
            let device = Device::flex();
            let m = Three::new(&device);
            let sel = if world.rank() == 0 {
                ParamSelection::ids([])
            } else {
                ParamSelection::All
            };
            average_in_group(m, &sel, &world).map(|_| ())
        })
        .unwrap();
    assert_eq!(out[0], Ok(()), "an empty selection does not communicate");
    match &out[1] {
        Err(AveragerError::Comm(CommError::PeerFailed { rank: 0, .. })) => {}
        Err(AveragerError::Comm(CommError::Timeout { missing, .. })) if missing == &[0] => {}
        other => panic!("expected an error naming rank 0, got {other:?}"),
    }
}

#[test]
fn a_failed_peer_is_an_error_not_a_hang() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world| {
            if world.rank() == 1 {
                return Ok(()); // leaves without averaging: its handle is dropped
            }
            let m = Three::new(&Device::flex());
            average_in_group(m, &ParamSelection::All, &world).map(|_| ())
        })
        .unwrap();
    assert!(
        matches!(
            &out[0],
            Err(AveragerError::Comm(CommError::PeerFailed { rank: 1, .. }))
        ),
        "{:?}",
        out[0]
    );
}
