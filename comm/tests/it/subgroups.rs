//! Subgroup layouts and the validation messages of the book's semantics §3.

use localsgd_comm::{CommError, GroupExt, ReduceOp, ThreadWorld};

#[test]
fn blocks_of_two_on_four_ranks() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|g| {
            let sub = g.new_subgroups(2).unwrap();
            let mut v = vec![g.rank() as f32];
            sub.all_reduce_slice(&mut v, ReduceOp::Sum).unwrap();
            (sub.rank(), sub.size(), sub.world_ranks().to_vec(), v[0])
        })
        .unwrap();
    assert_eq!(out[0], (0, 2, vec![0, 1], 1.0));
    assert_eq!(out[1], (1, 2, vec![0, 1], 1.0));
    assert_eq!(out[2], (0, 2, vec![2, 3], 5.0));
    assert_eq!(out[3], (1, 2, vec![2, 3], 5.0));
}

#[test]
fn nested_subgroups_report_world_ranks() {
    let out = ThreadWorld::new(8)
        .unwrap()
        .run(|g| {
            let half = g.new_subgroups(4).unwrap();
            let pair = half.new_subgroups(2).unwrap();
            pair.world_ranks().to_vec()
        })
        .unwrap();
    assert_eq!(out[5], vec![4, 5]);
    assert_eq!(out[6], vec![6, 7]);
}

#[test]
fn split_by_color_orders_by_parent_rank() {
    let out = ThreadWorld::new(6)
        .unwrap()
        .run(|g| {
            let sub = g.split((g.rank() % 2) as u64).unwrap();
            (sub.rank(), sub.world_ranks().to_vec())
        })
        .unwrap();
    assert_eq!(out[3], (1, vec![1, 3, 5]));
    assert_eq!(out[4], (2, vec![0, 2, 4]));
}

#[test]
fn intra_node_follows_hosts() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .with_hosts(vec![7, 7, 9, 9])
        .unwrap()
        .run(|g| g.intra_node().unwrap().world_ranks().to_vec())
        .unwrap();
    assert_eq!(out, vec![vec![0, 1], vec![0, 1], vec![2, 3], vec![2, 3]]);
    // One process, default hosts: all ranks.
    let out = ThreadWorld::new(3)
        .unwrap()
        .run(|g| g.intra_node().unwrap().size())
        .unwrap();
    assert_eq!(out, vec![3, 3, 3]);
}

#[test]
fn subgroup_size_validation_messages() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|g| {
            [0, 5, 3]
                .map(|s| g.new_subgroups(s).map(|_| ()).unwrap_err().to_string())
                .to_vec()
        })
        .unwrap();
    for msgs in out {
        assert!(msgs[0].contains("must be positive"), "{}", msgs[0]);
        assert!(
            msgs[1].contains("must not exceed the group size"),
            "{}",
            msgs[1]
        );
        assert!(
            msgs[1].contains('5') && msgs[1].contains('4'),
            "{}",
            msgs[1]
        );
        assert!(msgs[2].contains("must be divisible"), "{}", msgs[2]);
        assert!(msgs[2].contains('3'), "{}", msgs[2]);
    }
    assert!(matches!(
        ThreadWorld::new(0),
        Err(CommError::InvalidConfig(_))
    ));
}
