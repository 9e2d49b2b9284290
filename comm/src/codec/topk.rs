//! Top-k selection within a chunk: the `k` elements of largest magnitude, ties to the lower
//! index, returned in ascending index order.

use std::cmp::Ordering;

/// Fill `picked` with the offsets of the `k` elements of `chunk` of largest `|x|` (ties broken by
/// the lower offset), in ascending order. `chunk` must be finite, `k <= chunk.len() <= 65536`.
pub(crate) fn select(chunk: &[f32], k: usize, picked: &mut Vec<u16>) {
    debug_assert!(k <= chunk.len() && chunk.len() <= 1 << 16);
    picked.clear();
    picked.extend((0..chunk.len()).map(|i| i as u16));
    if k < chunk.len() {
        // Largest magnitude first, then lower offset: a total order, since offsets differ.
        let order = |a: &u16, b: &u16| -> Ordering {
            let (xa, xb) = (chunk[*a as usize].abs(), chunk[*b as usize].abs());
            xb.total_cmp(&xa).then(a.cmp(b))
        };
        if k > 0 {
            picked.select_nth_unstable_by(k - 1, order);
        }
        picked.truncate(k);
    }
    picked.sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_index() {
        let x = [1.0f32, -3.0, 3.0, 2.0, -3.0, 0.5, 3.0, 0.0];
        let mut picked = Vec::new();
        select(&x, 2, &mut picked);
        assert_eq!(picked, [1, 2]);
        select(&x, 3, &mut picked);
        assert_eq!(picked, [1, 2, 4]);
        select(&x, 5, &mut picked);
        assert_eq!(picked, [1, 2, 3, 4, 6]);
        select(&x, 8, &mut picked);
        assert_eq!(picked, [0, 1, 2, 3, 4, 5, 6, 7]);
        // -0.0 and 0.0 tie.
        select(&[0.0, -0.0, 0.0, -0.0], 2, &mut picked);
        assert_eq!(picked, [0, 1]);
        select(&[-0.0, 0.0, 0.0, -0.0], 1, &mut picked);
        assert_eq!(picked, [0]);
    }

    #[test]
    fn matches_a_full_sort() {
        let mut s = 12345u64;
        let mut next = || {
            s = super::super::rng::splitmix64(s);
            ((s >> 40) % 9) as f32 - 4.0 // many ties
        };
        for len in [1usize, 2, 7, 64, 300] {
            let x: Vec<f32> = (0..len).map(|_| next()).collect();
            for k in 1..=len {
                let mut picked = Vec::new();
                select(&x, k, &mut picked);
                let mut all: Vec<usize> = (0..len).collect();
                all.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()).then(a.cmp(&b)));
                let mut want: Vec<u16> = all[..k].iter().map(|&i| i as u16).collect();
                want.sort_unstable();
                assert_eq!(picked, want, "len {len} k {k}");
            }
        }
    }
}
