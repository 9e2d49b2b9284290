//! The noise of stochastic rounding: splitmix64 hashes of the seed, the round, the rank and each
//! element's global index, so every draw is a pure function of them (a resume reproduces it).

/// splitmix64's output function applied to `x` (Vigna's `splitmix64` with the state `x`).
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of one rank's draws in one round:
/// `splitmix64(splitmix64(splitmix64(seed) ^ round) ^ rank)`.
pub fn noise_key(seed: u64, round: u64, rank: u64) -> u64 {
    splitmix64(splitmix64(splitmix64(seed) ^ round) ^ rank)
}

/// The uniform draw in [0, 1) for element `index` (global, in the flat vector):
/// the top 24 bits of `splitmix64(key ^ index)` divided by 2^24 (exact in f32).
pub fn uniform(key: u64, index: u64) -> f32 {
    (splitmix64(key ^ index) >> 40) as f32 / 16_777_216.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_known_values() {
        // Vigna's generator seeded with 0 returns these first (its state advances by the
        // golden gamma, which this function adds before mixing).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn uniform_is_in_unit_interval_and_varies() {
        let key = noise_key(42, 3, 1);
        let draws: Vec<f32> = (0..1000).map(|i| uniform(key, i)).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f32>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        assert_ne!(noise_key(42, 3, 1), noise_key(42, 3, 0));
        assert_ne!(noise_key(42, 3, 1), noise_key(42, 4, 1));
    }
}
