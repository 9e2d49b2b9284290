//! `CommBench`, the measurement of `localsgd bench-comm`: rows in order, on threads and over a
//! group, every rank measuring the same figure.

use localsgd_comm::ThreadWorld;
use localsgd_planner::measure::CommBench;
use std::time::Duration;

#[test]
fn threads_give_a_row_per_length_and_worker_count() {
    let bench = CommBench::new(vec![1, 256], 1, Duration::ZERO).unwrap();
    let rows = bench.threads(&[1, 2]).unwrap();
    let keys: Vec<(usize, usize)> = rows.iter().map(|r| (r.floats, r.workers)).collect();
    assert_eq!(keys, [(1, 1), (1, 2), (256, 1), (256, 2)]);
    for r in &rows {
        assert_eq!(r.backend, "threads");
        assert!(r.allreduce_gbps > 0.0 && r.memcpy_gbps > 0.0, "{r:?}");
        // The time per all-reduce is the buffer's bytes over the rate.
        let bytes = r.allreduce_us() * r.allreduce_gbps * 1e3;
        assert!((bytes - 4.0 * r.floats as f64).abs() < 1e-6, "{r:?}");
    }
    // One length's memcpy figure serves every worker count.
    assert_eq!(rows[0].memcpy_gbps, rows[1].memcpy_gbps);
}

#[test]
fn a_group_reports_on_rank_0_only() {
    let gap = Duration::from_micros(100);
    let bench = CommBench::new(vec![1, 64], 1, gap).unwrap();
    assert_eq!(bench.iters(1), 2000);
    let results = ThreadWorld::new(2)
        .unwrap()
        .run(|g| bench.group(g.as_ref()).unwrap())
        .unwrap();
    let rows = results[0].as_ref().expect("rank 0 has the rows");
    assert!(results[1].is_none());
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[1].backend, rows[1].workers, rows[1].floats),
        ("threads", 2, 64)
    );
    // Each all-reduce after 100 µs of spinning, only the all-reduces timed.
    assert!(rows[0].allreduce_us() < 100.0 * 100.0, "{:?}", rows[0]);
}
