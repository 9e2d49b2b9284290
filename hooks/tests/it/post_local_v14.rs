//! Vector V14 (the book's semantics §10): the post-local SGD hook on 4 ranks, local gradient = rank, 15 iterations
//! (one bucket per iteration), plus a multi-bucket model that must count iterations, not buckets.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::prelude::*;
use localsgd_comm::{Group, ThreadWorld};
use localsgd_hooks::{
    BucketCaps, BucketData, CommHook, GradBucket, GradientReducer, PostLocalSgdHook,
};
use std::sync::Arc;

/// Run `iters` one-bucket iterations with gradient = rank; the bucket value after each.
fn gradients_seen(hook: &mut PostLocalSgdHook, rank: usize, iters: usize) -> Vec<f32> {
    (0..iters)
        .map(|_| {
            let mut bucket = GradBucket::new(0, true, BucketData::F32(vec![rank as f32; 3]));
            hook.run(&mut bucket).unwrap();
            let BucketData::F32(v) = bucket.into_data() else {
                panic!("bucket changed type")
            };
            assert!(v.iter().all(|&x| x == v[0]));
            v[0]
        })
        .collect()
}

fn pair_mean(rank: usize) -> f32 {
    if rank < 2 { 0.5 } else { 2.5 }
}

#[test]
fn subgroup_world_start_10_averages_globally_throughout() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| {
            let mut hook = PostLocalSgdHook::new(world.clone(), Some(world.clone()), 10, true);
            let seen = gradients_seen(&mut hook, world.rank(), 15);
            (seen, hook.iter())
        })
        .unwrap();
    for (seen, iter) in out {
        assert_eq!(seen, vec![1.5; 15]);
        assert_eq!(iter, 10);
    }
}

#[test]
fn no_post_local_allreduce_keeps_own_gradient_after_warmup() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| {
            let mut hook = PostLocalSgdHook::new(world.clone(), Some(world.clone()), 10, false);
            let mut skips = Vec::new();
            let mut seen = Vec::new();
            for _ in 0..15 {
                skips.push(hook.skips_communication());
                seen.extend(gradients_seen(&mut hook, world.rank(), 1));
            }
            (seen, skips, hook.iter())
        })
        .unwrap();
    for (rank, (seen, skips, iter)) in out.into_iter().enumerate() {
        let mut want = vec![1.5; 10];
        want.extend([rank as f32; 5]);
        assert_eq!(seen, want, "rank {rank}");
        let mut want_skips = vec![false; 10];
        want_skips.extend([true; 5]);
        assert_eq!(skips, want_skips, "rank {rank}");
        assert_eq!(iter, 10);
    }
}

#[test]
fn subgroup_pairs_start_10_switches_to_pair_means() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| {
            let pairs = world.new_subgroups(2).unwrap();
            let mut hook = PostLocalSgdHook::new(world.clone(), Some(pairs), 10, true);
            gradients_seen(&mut hook, world.rank(), 15)
        })
        .unwrap();
    for (rank, seen) in out.into_iter().enumerate() {
        let mut want = vec![1.5; 10];
        want.extend([pair_mean(rank); 5]);
        assert_eq!(seen, want, "rank {rank}");
    }
}

#[test]
fn start_1000_always_global_and_counts_every_iteration() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| {
            let mut hook = PostLocalSgdHook::new(world.clone(), Some(world.clone()), 1000, true);
            let seen = gradients_seen(&mut hook, world.rank(), 15);
            (seen, hook.iter())
        })
        .unwrap();
    for (seen, iter) in out {
        assert_eq!(seen, vec![1.5; 15]);
        assert_eq!(iter, 15);
    }
}

#[test]
fn start_0_pairs_local_from_the_first_iteration() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| {
            let pairs = world.new_subgroups(2).unwrap();
            let mut hook = PostLocalSgdHook::new(world.clone(), Some(pairs), 0, true);
            let seen = gradients_seen(&mut hook, world.rank(), 15);
            (seen, hook.iter())
        })
        .unwrap();
    for (rank, (seen, iter)) in out.into_iter().enumerate() {
        assert_eq!(seen, vec![pair_mean(rank); 15], "rank {rank}");
        assert_eq!(iter, 0);
    }
}

#[test]
fn default_subgroup_is_the_intra_node_group_created_once() {
    // Two "hosts" of two ranks each: after the warmup the default subgroup is the host's pair.
    let out = ThreadWorld::new(4)
        .unwrap()
        .with_hosts(vec![7, 7, 9, 9])
        .unwrap()
        .run(|world: Group| {
            let mut hook = PostLocalSgdHook::new(world.clone(), None, 2, true);
            let mut seen = gradients_seen(&mut hook, world.rank(), 3);
            let first = hook.subgroup().cloned().unwrap();
            seen.extend(gradients_seen(&mut hook, world.rank(), 2));
            let same = Arc::ptr_eq(&first, hook.subgroup().unwrap());
            (seen, same, first.world_ranks().to_vec())
        })
        .unwrap();
    for (rank, (seen, same, members)) in out.into_iter().enumerate() {
        assert_eq!(
            seen,
            vec![1.5, 1.5, pair_mean(rank), pair_mean(rank), pair_mean(rank)]
        );
        assert!(same, "the subgroup is created once");
        assert_eq!(members, if rank < 2 { vec![0, 1] } else { vec![2, 3] });
    }
}

#[derive(Module, Debug)]
struct Mlp {
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

#[test]
fn multi_bucket_model_counts_iterations_not_buckets() {
    let out = ThreadWorld::new(4)
        .unwrap()
        .run(|world: Group| {
            let device = Device::flex().autodiff();
            let model = Mlp {
                fc1: LinearConfig::new(8, 16).init(&device),
                fc2: LinearConfig::new(16, 16).init(&device),
                fc3: LinearConfig::new(16, 4).init(&device),
            };
            // 64-byte caps: every parameter (>= 16 bytes, most > 64) lands in a small bucket.
            let mut reducer = GradientReducer::new(BucketCaps {
                first_bytes: 64,
                rest_bytes: 64,
            });
            let buckets = reducer.plan(&model).len();
            let mut hook = PostLocalSgdHook::new(world.clone(), None, 100, true);
            let mut iters = Vec::new();
            for _ in 0..5 {
                let x = Tensor::<2>::ones([2, 8], &device);
                let loss = model
                    .fc3
                    .forward(model.fc2.forward(model.fc1.forward(x)))
                    .sum();
                let grads = GradientsParams::from_grads(loss.backward(), &model);
                reducer.reduce(&model, grads, &mut hook).unwrap();
                iters.push(hook.iter());
            }
            (buckets, iters)
        })
        .unwrap();
    for (buckets, iters) in out {
        assert!(
            buckets >= 3,
            "the model must span 3+ buckets, got {buckets}"
        );
        assert_eq!(iters, vec![1, 2, 3, 4, 5]);
    }
}
