//! Hook state: serde round trips, exact restore of the post-local `iter`, and clear errors for
//! states from another hook kind or configuration.

use localsgd_comm::{Group, ThreadWorld};
use localsgd_hooks::{
    AllReduceHook, BucketData, CommHook, CompressHook, GradBucket, HookError, HookState,
    PostLocalSgdHook, PostLocalSgdState, Precision,
};

fn one_iteration(hook: &mut dyn CommHook, rank: usize) {
    let mut bucket = GradBucket::new(0, true, BucketData::F32(vec![rank as f32; 2]));
    hook.run(&mut bucket).unwrap();
}

#[test]
fn checkpoint_restores_iter_exactly_and_the_schedule_continues() {
    let out = ThreadWorld::new(2)
        .unwrap()
        .run(|world: Group| {
            let mut hook = PostLocalSgdHook::new(world.clone(), Some(world.clone()), 10, false);
            for _ in 0..4 {
                one_iteration(&mut hook, world.rank());
            }
            let json = serde_json::to_string(&hook.state()).unwrap();
            let saved: HookState = serde_json::from_str(&json).unwrap();

            let mut resumed = PostLocalSgdHook::new(world.clone(), Some(world.clone()), 10, false);
            resumed.load_state(&saved).unwrap();
            let restored = resumed.iter();
            // 6 more warmup iterations, then local SGD starts (no communication).
            for _ in 0..6 {
                assert!(!resumed.skips_communication());
                one_iteration(&mut resumed, world.rank());
            }
            (
                json,
                restored,
                resumed.iter(),
                resumed.skips_communication(),
            )
        })
        .unwrap();
    for (json, restored, iter, skips) in out {
        assert_eq!(
            json,
            r#"{"kind":"post_local_sgd","start_local_sgd_iter":10,"post_local_gradient_allreduce":false,"iter":4}"#
        );
        assert_eq!(restored, 4);
        assert_eq!(iter, 10);
        assert!(skips);
    }
}

#[test]
fn compressed_state_nests_the_inner_state() {
    let out = ThreadWorld::new(1)
        .unwrap()
        .run(|world: Group| {
            let inner = PostLocalSgdHook::new(world.clone(), Some(world.clone()), 3, true);
            let mut hook = CompressHook::bf16(inner);
            one_iteration(&mut hook, 0);
            let state = hook.state();
            let mut fresh = CompressHook::bf16(PostLocalSgdHook::new(
                world.clone(),
                Some(world.clone()),
                3,
                true,
            ));
            fresh.load_state(&state).unwrap();
            let wrong = CompressHook::fp16(PostLocalSgdHook::new(world.clone(), None, 3, true))
                .load_state(&state)
                .unwrap_err();
            (state, fresh.inner().iter(), wrong)
        })
        .unwrap();
    let (state, iter, wrong) = &out[0];
    assert_eq!(
        state,
        &HookState::Compressed {
            precision: Precision::Bf16,
            inner: Box::new(HookState::PostLocalSgd(PostLocalSgdState {
                start_local_sgd_iter: 3,
                post_local_gradient_allreduce: true,
                iter: 1,
            })),
        }
    );
    assert_eq!(*iter, 1);
    let msg = wrong.to_string();
    assert!(
        msg.contains("bf16_compress(post_local_sgd)")
            && msg.contains("fp16_compress(post_local_sgd)"),
        "{msg}"
    );
}

#[test]
fn mismatched_states_are_rejected_with_the_difference_named() {
    let out = ThreadWorld::new(1)
        .unwrap()
        .run(|world: Group| {
            let mut post = PostLocalSgdHook::new(world.clone(), None, 10, true);
            let mut plain = AllReduceHook::new(world.clone());
            let saved = |start, allreduce, iter| {
                HookState::PostLocalSgd(PostLocalSgdState {
                    start_local_sgd_iter: start,
                    post_local_gradient_allreduce: allreduce,
                    iter,
                })
            };
            let errors: Vec<HookError> = vec![
                plain.load_state(&saved(10, true, 2)).unwrap_err(),
                post.load_state(&HookState::AllReduce).unwrap_err(),
                post.load_state(&saved(12, true, 2)).unwrap_err(),
                post.load_state(&saved(10, false, 2)).unwrap_err(),
                post.load_state(&saved(10, true, 11)).unwrap_err(),
            ];
            let ok = plain.load_state(&HookState::AllReduce).is_ok();
            (
                errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
                ok,
                post.iter(),
            )
        })
        .unwrap();
    let (msgs, ok, iter) = &out[0];
    assert!(ok);
    assert_eq!(*iter, 0, "a rejected state leaves the hook untouched");
    let expect = [
        ["post_local_sgd", "all_reduce"],
        ["all_reduce", "post_local_sgd"],
        ["start_local_sgd_iter = 12", "has 10"],
        ["post_local_gradient_allreduce = false", "has true"],
        ["iter 11", "start_local_sgd_iter 10"],
    ];
    for (msg, parts) in msgs.iter().zip(expect) {
        for p in parts {
            assert!(msg.contains(p), "{msg:?} should mention {p:?}");
        }
    }
}
