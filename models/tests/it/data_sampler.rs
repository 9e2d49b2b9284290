//! `ShardSampler` against PyTorch `DistributedSampler(shuffle=False, drop_last=False)` +
//! `DataLoader(drop_last=False)`. Expected values: PyTorch's documented behaviour, computed by a
//! literal transcription of `DistributedSampler.__iter__` (pad with `indices[:pad]`, or
//! `(indices * ceil(pad / n))[:pad]` when pad > n; then `indices[rank:total_size:world]`).

use std::collections::BTreeSet;

use localsgd_models::data::{DataError, ShardSampler};

fn all_ranks(n: usize, world: usize) -> Vec<Vec<usize>> {
    (0..world)
        .map(|r| ShardSampler::new(n, world, r).unwrap().epoch_indices(0))
        .collect()
}

#[test]
fn ten_rows_three_ranks() {
    assert_eq!(
        all_ranks(10, 3),
        vec![vec![0, 3, 6, 9], vec![1, 4, 7, 0], vec![2, 5, 8, 1]]
    );
}

#[test]
fn padding_wraps_around_and_repeats() {
    assert_eq!(all_ranks(2, 4), vec![vec![0], vec![1], vec![0], vec![1]]);
    assert_eq!(
        all_ranks(2, 5),
        vec![vec![0], vec![1], vec![0], vec![1], vec![0]]
    );
    assert_eq!(
        all_ranks(3, 8),
        vec![
            vec![0],
            vec![1],
            vec![2],
            vec![0],
            vec![1],
            vec![2],
            vec![0],
            vec![1]
        ]
    );
    assert_eq!(all_ranks(1, 3), vec![vec![0], vec![0], vec![0]]);
    assert_eq!(all_ranks(5, 1), vec![vec![0, 1, 2, 3, 4]]);
}

#[test]
fn batches_keep_the_smaller_last_batch() {
    let s = ShardSampler::new(10, 3, 1).unwrap();
    assert_eq!(s.batches(0, 3).unwrap(), vec![vec![1, 4, 7], vec![0]]);
    let sizes: Vec<usize> = s.batches(0, 3).unwrap().iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![3, 1]);
    assert_eq!(s.num_batches(3).unwrap(), 2);
    let single = ShardSampler::new(10, 1, 0).unwrap();
    assert_eq!(
        single.batches(0, 4).unwrap(),
        vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
    );
    // The digits training split on 4 ranks, batch 32: rank 3 has 12 batches, the last one
    // ends with the wrapped-around row 2.
    let digits = ShardSampler::new(1437, 4, 3).unwrap();
    let batches = digits.batches(0, 32).unwrap();
    assert_eq!(batches.len(), 12);
    assert_eq!(digits.num_batches(32).unwrap(), 12);
    assert_eq!(
        batches[11],
        vec![1411, 1415, 1419, 1423, 1427, 1431, 1435, 2]
    );
}

#[test]
fn empty_dataset_gives_no_batches() {
    let s = ShardSampler::new(0, 2, 1).unwrap();
    assert!(s.epoch_indices(0).is_empty());
    assert!(s.batches(0, 4).unwrap().is_empty());
    assert_eq!(s.num_batches(4).unwrap(), 0);
}

#[test]
fn shuffle_is_a_shared_permutation_per_epoch() {
    let (n, world) = (23, 4);
    let ranks = |epoch| -> Vec<Vec<usize>> {
        (0..world)
            .map(|r| {
                ShardSampler::new(n, world, r)
                    .unwrap()
                    .with_shuffle(99)
                    .epoch_indices(epoch)
            })
            .collect()
    };
    let e0 = ranks(0);
    assert_eq!(e0, ranks(0), "same (seed, epoch) must give the same order");
    assert_ne!(e0, ranks(1), "a new epoch must reshuffle");
    // Every rank gets ceil(23/4) = 6 indices; together they cover every row, and only the
    // 24 - 23 = 1 padding slot repeats a row.
    assert!(e0.iter().all(|r| r.len() == 6));
    let flat: Vec<usize> = e0.iter().flatten().copied().collect();
    let distinct: BTreeSet<usize> = flat.iter().copied().collect();
    assert_eq!(distinct, (0..n).collect());
    assert_eq!(flat.len(), 24);
    assert_ne!(
        e0[0],
        vec![0, 4, 8, 12, 16, 20],
        "shuffled order must differ from 0..n"
    );
    let other_seed = ShardSampler::new(n, world, 0)
        .unwrap()
        .with_shuffle(100)
        .epoch_indices(0);
    assert_ne!(e0[0], other_seed);
}

#[test]
fn invalid_configuration_is_rejected() {
    assert!(matches!(
        ShardSampler::new(10, 0, 0),
        Err(DataError::InvalidSampler { world: 0, rank: 0 })
    ));
    let err = ShardSampler::new(10, 2, 2).unwrap_err().to_string();
    assert!(
        err.contains("rank 2") && err.contains("world size 2"),
        "{err}"
    );
    let s = ShardSampler::new(10, 2, 1).unwrap();
    assert!(matches!(s.batches(0, 0), Err(DataError::ZeroBatchSize)));
    assert!(matches!(s.num_batches(0), Err(DataError::ZeroBatchSize)));
}

/// A world that takes over mid-epoch ([`ShardSampler::redeal`]): worked by hand. Ten rows, 4
/// ranks, batches of 2: rank r visits rows r, r + 4, r + 8 (mod 10): [[0, 4], [8]],
/// [[1, 5], [9]], [[2, 6], [0]], [[3, 7], [1]]. After one batch each, rows 0..8 are dealt.
#[test]
fn redeal_continues_an_epoch_on_another_number_of_ranks() {
    use localsgd_pipeline::pipeline::DataPosition;
    let at = |epoch, next_batch, start| DataPosition {
        epoch,
        next_batch,
        start,
    };
    let three = |r| ShardSampler::new(10, 3, r).unwrap();
    // 4 -> 3 after one batch: rows 8 and 9 are left, dealt 8, 9 and (padding) 8.
    let p = three(0).redeal(at(5, 1, 0), 4, 2).unwrap();
    assert_eq!(p, at(5, 0, 8));
    let rest: Vec<Vec<usize>> = (0..3)
        .map(|r| three(r).epoch_indices_from(0, p.start as usize))
        .collect();
    assert_eq!(rest, vec![vec![8], vec![9], vec![8]]);
    // After both batches the epoch is dealt out: the new world starts with an empty epoch.
    assert_eq!(three(1).redeal(at(5, 2, 0), 4, 2).unwrap(), at(5, 0, 10));
    assert!(three(1).epoch_indices_from(0, 10).is_empty());
    // Shrinking again from a dealt epoch: 3 ranks at row 8 that took one row each deal both.
    let two = ShardSampler::new(10, 2, 0).unwrap();
    assert_eq!(two.redeal(at(5, 1, 8), 3, 2).unwrap(), at(5, 0, 10));
    // 2 -> 4 after one batch of 2: rank r of 2 visited r, r + 2, so rows 0..4 are dealt; the
    // 6 left go to 4 ranks as 4 5 6 7 / 8 9 4 5 (padding from row 4).
    let four = |r| ShardSampler::new(10, 4, r).unwrap();
    let p = four(0).redeal(at(0, 1, 0), 2, 2).unwrap();
    assert_eq!(p, at(0, 0, 4));
    let rest: Vec<Vec<usize>> = (0..4).map(|r| four(r).epoch_indices_from(0, 4)).collect();
    assert_eq!(rest, vec![vec![4, 8], vec![5, 9], vec![6, 4], vec![7, 5]]);
    // The same world size keeps the position.
    assert_eq!(three(2).redeal(at(1, 2, 3), 3, 2).unwrap(), at(1, 2, 3));
    assert!(matches!(
        three(0).redeal(at(0, 1, 0), 4, 0),
        Err(DataError::ZeroBatchSize)
    ));
}

/// [`ShardSampler::redeal`] over many layouts: the rows the old world visited (each of its
/// ranks' first `next_batch` batches) and the rows the new world is dealt cover the epoch's rows
/// from the start row exactly once, apart from the wrap-around padding, which only repeats rows
/// (an independent count, not the sampler's own arithmetic).
#[test]
fn redeal_covers_the_rest_of_the_epoch_exactly_once() {
    use localsgd_pipeline::pipeline::DataPosition;
    use std::collections::BTreeSet;
    for n in 1..30usize {
        for old_world in 1..5usize {
            for new_world in 1..5usize {
                for batch in 1..4usize {
                    for start in [0, n / 3, n - 1] {
                        let rest: BTreeSet<usize> = (start..n).collect();
                        let per_rank = (n - start).div_ceil(old_world);
                        for next_batch in 0..=per_rank.div_ceil(batch) {
                            let taken = (next_batch * batch).min(per_rank);
                            let old: BTreeSet<usize> = (0..old_world)
                                .flat_map(|r| {
                                    let s = ShardSampler::new(n, old_world, r).unwrap();
                                    s.epoch_indices_from(0, start)[..taken].to_vec()
                                })
                                .collect();
                            let at = DataPosition {
                                epoch: 0,
                                next_batch: next_batch as u64,
                                start: start as u64,
                            };
                            let new_sampler = ShardSampler::new(n, new_world, 0).unwrap();
                            let p = new_sampler.redeal(at, old_world, batch).unwrap();
                            if new_world == old_world {
                                assert_eq!(p, at);
                                continue;
                            }
                            assert_eq!(p.next_batch, 0);
                            let new: BTreeSet<usize> = (0..new_world)
                                .flat_map(|r| {
                                    ShardSampler::new(n, new_world, r)
                                        .unwrap()
                                        .epoch_indices_from(0, p.start as usize)
                                })
                                .collect();
                            let case = format!(
                                "n {n}, {old_world} -> {new_world}, batch {batch}, start {start}, \
                                 next_batch {next_batch}"
                            );
                            assert!(old.is_disjoint(&new), "{case}: a row visited twice");
                            let all: BTreeSet<usize> = old.union(&new).copied().collect();
                            assert_eq!(all, rest, "{case}: rows skipped");
                        }
                    }
                }
            }
        }
    }
}
