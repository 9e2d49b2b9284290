//! The measurement definitions of `localsgd_planner::measure::throughput` that benchmarks and
//! the cost model's inputs rest on.

use localsgd_comm::ThreadWorld;
use localsgd_planner::measure::throughput::allreduce_time_between;
use std::time::Duration;

#[test]
fn the_gap_is_spun_before_each_all_reduce_and_not_timed() {
    let gap = Duration::from_millis(100);
    let iters = 3;
    let results = ThreadWorld::new(2)
        .unwrap()
        .run(|g| {
            // Rank 0 holds 1, rank 1 holds 2: three in-place sums give 3, 6, 12.
            let mut buf = vec![g.rank() as f32 + 1.0; 4];
            let time = allreduce_time_between(g.as_ref(), &mut buf, iters, gap).unwrap();
            (buf, time)
        })
        .unwrap();
    for (buf, time) in &results {
        assert_eq!(buf, &vec![12.0; 4], "every all-reduce ran, in place");
        // Timing the gaps too would give at least 3 x 100 ms; the all-reduces of 4 floats
        // between two threads take microseconds.
        assert!(
            *time < gap * iters as u32,
            "the gaps were timed: {time:?} for {iters} all-reduces"
        );
    }
    assert_eq!(results[0].1, results[1].1, "every rank reports the slowest");
}
