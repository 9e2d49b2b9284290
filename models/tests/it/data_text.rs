//! The byte-level text data set (`data::text`): exact windows, the held-out tail, every error, the
//! shipped text, and sharding by `ShardSampler` (PyTorch's `DistributedSampler` rule).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use localsgd_models::data::text::{self, DEFAULT_VALID_FRACTION, VOCAB_SIZE};
use localsgd_models::data::{DataError, Dataset, ShardSampler};

/// The text the repository ships for tests and examples (data/README.md).
fn shipped_text() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/text/localsgd-docs.txt")
}

/// Row `i` of `data` as bytes.
fn row_bytes(data: &Dataset, i: usize) -> Vec<u8> {
    data.row(i).unwrap().iter().map(|&v| v as u8).collect()
}

/// Every row of `data` as bytes.
fn all_rows(data: &Dataset) -> Vec<Vec<u8>> {
    (0..data.len()).map(|i| row_bytes(data, i)).collect()
}

#[test]
fn exact_windows_on_a_literal_text() {
    // 20 bytes, a quarter held out: the first 15, "the cat sat on ", train; "a mat" validates.
    let split = text::from_bytes(b"the cat sat on a mat", 3, 0.25).unwrap();
    // Windows of 4 bytes at stride 3; 15 training bytes give (15 - 1) / 3 = 4 windows (2 bytes
    // dropped), 5 validation bytes give (5 - 1) / 3 = 1 window (1 byte dropped).
    assert_eq!(
        all_rows(&split.train),
        [&b"the "[..], b" cat", b"t sa", b"at o"]
    );
    assert_eq!(all_rows(&split.test), [&b"a ma"[..]]);
    for data in [&split.train, &split.test] {
        assert_eq!(data.dim(), 4);
        assert_eq!(data.num_classes(), VOCAB_SIZE);
        // The label is the window's last byte.
        let last: Vec<u32> = all_rows(data).iter().map(|w| u32::from(w[3])).collect();
        assert_eq!(data.labels(), last);
    }
    // Features are the byte values themselves, as exact floats.
    assert_eq!(split.train.row(0).unwrap(), &[116.0, 104.0, 101.0, 32.0]);
}

#[test]
fn every_byte_after_the_first_is_a_target_once() {
    let bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    for context in [1, 2, 7, 64] {
        let split = text::from_bytes(&bytes, context, 0.2).unwrap();
        for (data, part) in [(&split.train, &bytes[..800]), (&split.test, &bytes[800..])] {
            // Consecutive windows overlap by one byte; the targets (all but each window's first
            // byte) are the part's bytes 1.., up to the dropped remainder.
            let targets: Vec<u8> = all_rows(data)
                .iter()
                .flat_map(|w| w[1..].to_vec())
                .collect();
            let kept = (part.len() - 1) / context * context;
            assert_eq!(targets, &part[1..1 + kept], "context {context}");
            for i in 1..data.len() {
                assert_eq!(row_bytes(data, i)[0], row_bytes(data, i - 1)[context]);
            }
        }
    }
}

#[test]
fn any_bytes_not_only_utf8() {
    let bytes: Vec<u8> = (0..=255u8).rev().cycle().take(600).collect();
    assert!(std::str::from_utf8(&bytes).is_err());
    let split = text::from_bytes(&bytes, 8, DEFAULT_VALID_FRACTION).unwrap();
    assert_eq!(row_bytes(&split.train, 0), &bytes[..9]);
    assert!(
        split
            .train
            .features()
            .iter()
            .all(|&v| (0.0..=255.0).contains(&v))
    );
    assert_eq!(split.train.features()[0], 255.0);
}

#[test]
fn the_validation_part_is_the_tail_split_at_a_byte() {
    // floor(101 * 0.9) = 90 training bytes, the last 11 validate (nanoGPT's int(n * 0.9)).
    let bytes: Vec<u8> = (0..101).collect();
    let f = text::facts(bytes.len(), 5, DEFAULT_VALID_FRACTION).unwrap();
    assert_eq!((f.bytes, f.train_bytes, f.valid_bytes), (101, 90, 11));
    assert_eq!((f.train_windows, f.valid_windows), (17, 2));
    let split = text::from_bytes(&bytes, 5, DEFAULT_VALID_FRACTION).unwrap();
    assert_eq!(row_bytes(&split.train, 16), &bytes[80..86]);
    assert_eq!(row_bytes(&split.test, 0), &bytes[90..96]);
    assert_eq!(row_bytes(&split.test, 1), &bytes[95..101]);
    // The split is at a byte, even inside a multi-byte UTF-8 character: 50 + 4 × 3 = 62 bytes,
    // floor(62 * 0.9) = 55 is inside the second '€' (bytes 53..56).
    let text = format!("{}€€€€", "a".repeat(50));
    assert!(!text.is_char_boundary(55));
    let split = text::from_bytes(text.as_bytes(), 2, 0.1).unwrap();
    assert_eq!(split.test.len(), 3);
    assert_eq!(row_bytes(&split.test, 0), &text.as_bytes()[55..58]);
}

#[test]
fn facts_for_the_run_log() {
    let f = text::facts(40, 4, 0.25).unwrap();
    assert_eq!(
        f.to_string(),
        "40 bytes (30 training, 10 validation = the last 0.25), context 4: 7 training and 2 \
         validation windows of 5 bytes (2 trailing bytes dropped)"
    );
    assert_eq!((f.train_targets(), f.valid_targets()), (28, 8));
}

#[test]
fn load_reads_a_file_like_from_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.txt");
    let bytes: Vec<u8> = (0..500u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let (split, facts) = text::load_with_facts(&path, 16, 0.1).unwrap();
    assert_eq!(split, text::from_bytes(&bytes, 16, 0.1).unwrap());
    assert_eq!(split, text::load(&path, 16, 0.1).unwrap());
    assert_eq!(facts, text::facts(500, 16, 0.1).unwrap());
}

#[test]
fn the_shipped_text() {
    let path = shipped_text();
    let (split, facts) = text::load_with_facts(&path, 64, DEFAULT_VALID_FRACTION).unwrap();
    assert_eq!(facts.bytes, 292_359);
    assert_eq!((facts.train_bytes, facts.valid_bytes), (263_123, 29_236));
    assert_eq!((split.train.len(), split.test.len()), (4111, 456));
    assert_eq!(
        (facts.train_windows, facts.valid_windows),
        (split.train.len(), split.test.len())
    );
    assert!(std::fs::read_to_string(&path).unwrap().contains("DiLoCo"));
}

#[test]
fn two_ranks_shard_the_windows_like_distributed_sampler() {
    let bytes = std::fs::read(shipped_text()).unwrap();
    // 4111 training windows: odd, so DistributedSampler pads rank 1's shard with window 0.
    let split = text::from_bytes(&bytes, 64, DEFAULT_VALID_FRACTION).unwrap();
    let n = split.train.len();
    assert_eq!(n % 2, 1);
    let shard = |rank| ShardSampler::new(n, 2, rank).unwrap().epoch_indices(0);
    let (r0, r1) = (shard(0), shard(1));
    assert_eq!(r0.len(), n.div_ceil(2));
    assert_eq!(r1.len(), n.div_ceil(2));
    // indices[rank:total_size:world] of 0..n padded with indices[:pad].
    assert_eq!(r0, (0..n).step_by(2).collect::<Vec<_>>());
    let mut expected: Vec<usize> = (1..n).step_by(2).collect();
    expected.push(0);
    assert_eq!(r1, expected);
    // Disjoint but for the padding, and together every window.
    let (s0, s1): (BTreeSet<_>, BTreeSet<_>) =
        (r0.iter().collect(), r1[..r1.len() - 1].iter().collect());
    assert!(s0.is_disjoint(&s1));
    assert_eq!(s0.union(&s1).count(), n);
    // Shuffled: the same rule over one permutation shared by both ranks.
    let shuffled = |rank| {
        ShardSampler::new(n, 2, rank)
            .unwrap()
            .with_shuffle(7)
            .epoch_indices(3)
    };
    let (p0, p1) = (shuffled(0), shuffled(1));
    let all: BTreeSet<_> = p0.iter().chain(&p1).collect();
    assert_eq!(all.len(), n);
    assert_eq!(p1.last(), p0.first());
    // A shard's rows are whole windows of the text.
    let (x, _) = split
        .train
        .batch_tensors(&r1[..2], &burn::tensor::Device::flex())
        .unwrap();
    assert_eq!(x.dims(), [2, 65]);
    assert_eq!(row_bytes(&split.train, r1[0]), &bytes[64..129]);
}

#[test]
fn a_missing_file_names_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such.txt");
    let e = text::load(&path, 8, 0.1).unwrap_err();
    assert!(
        matches!(&e, DataError::TextRead { path: p, .. } if *p == path),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.starts_with("cannot read text file `"), "{msg}");
    assert!(msg.contains("no-such.txt"), "{msg}");
    // A directory is not a text file either.
    assert!(matches!(
        text::load(dir.path(), 8, 0.1),
        Err(DataError::TextRead { .. })
    ));
}

#[test]
fn an_empty_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.txt");
    std::fs::write(&path, b"").unwrap();
    let e = text::load(&path, 8, 0.1).unwrap_err();
    assert!(matches!(e, DataError::EmptyText { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with("text file `"), "{msg}");
    assert!(msg.contains("empty.txt` is empty"), "{msg}");
    assert!(matches!(
        text::from_bytes(b"", 8, 0.1),
        Err(DataError::EmptyText { .. })
    ));
}

#[test]
fn context_zero_is_an_error() {
    let e = text::from_bytes(b"some text", 0, 0.1).unwrap_err();
    assert!(
        matches!(e, DataError::InvalidContext { context: 0 }),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("invalid context 0: the context must be at least 1")
    );
    assert!(text::facts(100, 0, 0.1).is_err());
}

#[test]
fn a_validation_fraction_outside_zero_one_is_an_error() {
    for bad in [0.0, 1.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
        let e = text::from_bytes(&[b'a'; 100], 4, bad).unwrap_err();
        assert!(
            matches!(e, DataError::InvalidValidFraction { .. }),
            "{bad}: {e:?}"
        );
        assert!(e.to_string().contains("strictly between 0 and 1"), "{e}");
    }
}

#[test]
fn a_text_shorter_than_a_window_says_what_is_needed() {
    let e = text::from_bytes(b"abc", 4, 0.25).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::TextTooShort {
                part_bytes: 3,
                bytes: 3,
                context: 4,
                needed: 17,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "the text is too short for context 4 and validation fraction 0.25: the whole text has 3 \
         bytes, fewer than one window of context + 1 = 5 bytes; these settings need at least 17 \
         bytes in all and the text has 3: use a longer text or a smaller `context`"
    );
    // Through a file, the file is named.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.txt");
    std::fs::write(&path, b"abc").unwrap();
    let msg = text::load(&path, 4, 0.25).unwrap_err().to_string();
    assert!(msg.starts_with("text file `"), "{msg}");
    assert!(msg.contains("short.txt` is too short"), "{msg}");
}

#[test]
fn a_training_part_shorter_than_a_window_is_an_error() {
    // 12 bytes, three quarters held out: 3 training bytes, 9 validation bytes.
    let e = text::from_bytes(&[b'x'; 12], 4, 0.75).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::TextTooShort {
                part_bytes: 3,
                needed: 20,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("the training part (the first 3 bytes) has 3 bytes"),
        "{e}"
    );
    assert!(text::from_bytes(&[b'x'; 20], 4, 0.75).is_ok());
    assert!(text::from_bytes(&[b'x'; 19], 4, 0.75).is_err());
}

#[test]
fn a_validation_part_shorter_than_a_window_is_an_error() {
    // 16 bytes, a quarter held out: 12 training bytes, 4 validation bytes.
    let e = text::from_bytes(&[b'x'; 16], 4, 0.25).unwrap_err();
    assert!(
        matches!(
            e,
            DataError::TextTooShort {
                part_bytes: 4,
                needed: 17,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("the validation part (the last 4 bytes) has 4 bytes"),
        "{e}"
    );
    assert!(text::from_bytes(&[b'x'; 17], 4, 0.25).is_ok());
    // The shipped text cannot fill a context of half its length with 10% held out.
    let e = text::load(&shipped_text(), 100_000, 0.1).unwrap_err();
    assert!(matches!(e, DataError::TextTooShort { .. }), "{e:?}");
    assert!(e.to_string().contains("the validation part"), "{e}");
}
