//! `ProcessGroup::grow` on the thread backend: after a shrink, the survivors add a replacement
//! for the failed rank, which `ThreadWorld::run_each` starts on a thread of its own running the
//! world's closure.

use localsgd_comm::{CommError, Group, GroupExt, ProcessGroup, ReduceOp, ThreadWorld};
use std::time::Duration;

/// What a worker of the grown world saw.
#[derive(Debug, PartialEq)]
struct Member {
    joined: bool,
    rank: usize,
    world_ranks: Vec<usize>,
    host: u64,
    /// Sum of every member's world rank plus 100 per new member: who took part.
    sum: f64,
}

fn contribute(g: &Group) -> Result<f64, CommError> {
    let me = g.world_ranks()[g.rank()] as f64;
    let mut v = [me + if g.joined() { 100.0 } else { 0.0 }];
    g.all_reduce_slice(&mut v, ReduceOp::Sum)?;
    Ok(v[0])
}

fn member(g: &Group) -> Result<Member, CommError> {
    Ok(Member {
        joined: g.joined(),
        rank: g.rank(),
        world_ranks: g.world_ranks().to_vec(),
        host: g.host_id(),
        sum: contribute(g)?,
    })
}

#[test]
fn a_replacement_takes_the_failed_ranks_place() {
    let world = ThreadWorld::new(4)
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .with_hosts(vec![10, 11, 12, 13])
        .unwrap();
    let out = world.run_each(|g| -> Result<Member, CommError> {
        if g.joined() {
            return member(&g);
        }
        if g.rank() == 1 {
            panic!("rank 1 fails on purpose");
        }
        let mut v = [1f32];
        assert!(matches!(
            g.all_reduce_slice(&mut v, ReduceOp::Sum),
            Err(CommError::PeerFailed { rank: 1, .. })
        ));
        let survivors = g.shrink()?;
        assert_eq!(survivors.world_ranks(), &[0, 2, 3]);
        let grown = survivors.grow(&[1])?;
        member(&grown)
    });
    assert_eq!(out.len(), 5, "four workers and one replacement: {out:?}");
    assert_eq!(out[1].as_ref().map_err(|p| p.rank), Err(1));
    // 0 + 1 + 2 + 3, and the replacement's 100.
    let expect = |rank: usize, joined: bool, host: u64| Member {
        joined,
        rank,
        world_ranks: vec![0, 1, 2, 3],
        host,
        sum: 106.0,
    };
    assert_eq!(
        out[0].as_ref().unwrap().as_ref().unwrap(),
        &expect(0, false, 10)
    );
    assert_eq!(
        out[2].as_ref().unwrap().as_ref().unwrap(),
        &expect(2, false, 12)
    );
    assert_eq!(
        out[3].as_ref().unwrap().as_ref().unwrap(),
        &expect(3, false, 13)
    );
    // The replacement: world rank 1, in the failed rank's place and on its host.
    assert_eq!(
        out[4].as_ref().unwrap().as_ref().unwrap(),
        &expect(1, true, 11)
    );
}

#[test]
fn a_replacement_can_fail_and_be_replaced_again() {
    let world = ThreadWorld::new(3)
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let replacements = std::sync::atomic::AtomicUsize::new(0);
    let out = world.run_each(|g| -> Result<f64, CommError> {
        let fail = if g.joined() {
            // The first replacement fails too; the second one stays.
            replacements.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0
        } else {
            g.rank() == 2
        };
        if fail {
            panic!("world rank 2 fails");
        }
        let mut g = g;
        loop {
            match contribute(&g) {
                Ok(sum) => return Ok(sum),
                Err(CommError::PeerFailed { rank: 2, .. }) => {
                    g = g.shrink()?.grow(&[2])?;
                }
                Err(e) => return Err(e),
            }
        }
    });
    assert_eq!(out.len(), 5, "{out:?}");
    assert!(out[2].is_err() && out[3].is_err(), "{out:?}");
    for i in [0, 1, 4] {
        assert_eq!(out[i], Ok(Ok(103.0)), "worker {i}: {out:?}");
    }
}

#[test]
fn groups_taken_by_hand_cannot_grow() {
    let groups = ThreadWorld::new(1).unwrap().groups();
    let g = groups.into_iter().next().unwrap();
    assert!(matches!(
        g.grow(&[1]),
        Err(CommError::Unsupported {
            operation: "grow",
            ..
        })
    ));
    assert!(!g.joined());
}

#[test]
fn a_member_rank_or_disagreeing_lists_are_refused() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .run(|g| {
            let member = g.grow(&[1]);
            let empty = g.grow(&[]);
            let twice = g.grow(&[5, 5]);
            let mine = if g.rank() == 0 { [2] } else { [3] };
            let disagree = g.grow(&mine);
            let lengths: &[usize] = if g.rank() == 0 { &[2] } else { &[2, 3] };
            let longer = g.grow(lengths);
            (member, empty, twice, disagree, longer)
        })
        .unwrap();
    for (member, empty, twice, disagree, longer) in out {
        match longer {
            Err(CommError::InvalidConfig(m)) => assert!(m.contains("different ranks"), "{m}"),
            other => panic!("expected the lists' disagreement, got {other:?}"),
        }
        assert!(matches!(member, Err(CommError::InvalidConfig(_))));
        assert!(matches!(empty, Err(CommError::InvalidConfig(_))));
        assert!(matches!(twice, Err(CommError::InvalidConfig(_))));
        match disagree {
            Err(CommError::InvalidConfig(m)) => assert!(m.contains("different ranks"), "{m}"),
            other => panic!("expected the lists' disagreement, got {other:?}"),
        }
    }
}
