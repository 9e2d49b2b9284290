//! The bundled digits data against reference values read from the file with
//! `zcat data/digits.csv.gz | ...` shell one-liners (not with our parser).

use localsgd_models::data::{DataError, digits};

/// `zcat digits.csv.gz | head -1`: 64 pixels then the label.
const FIRST_ROW: [u32; 64] = [
    0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0,
    8, 8, 0, 0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6,
    13, 10, 0, 0, 0,
];
const FIRST_LABEL: u32 = 0;
/// `zcat digits.csv.gz | sed -n 1438p`: the first test row.
const FIRST_TEST_ROW_PREFIX: [u32; 8] = [0, 4, 16, 15, 2, 0, 0, 0];
const FIRST_TEST_LABEL: u32 = 2;
/// `... | tail -1`: label of the last row.
const LAST_LABEL: u32 = 8;
/// `zcat digits.csv.gz | tail -n +1438 | awk -F, '{print $65}' | sort -n | uniq -c`
const TEST_LABEL_COUNTS: [usize; 10] = [35, 36, 35, 37, 37, 37, 37, 36, 33, 37];
/// `zcat digits.csv.gz | head -1437 | awk -F, '{print $65}' | sort -n | uniq -c`
const TRAIN_LABEL_COUNTS: [usize; 10] = [143, 146, 142, 146, 144, 145, 144, 143, 141, 143];
/// `zcat digits.csv.gz | head -1437 | awk -F, '{for(i=1;i<=64;i++) s+=$i} END{print s}'`
const TRAIN_PIXEL_SUM: f64 = 449_372.0;

fn counts(labels: &[u32]) -> [usize; 10] {
    let mut c = [0; 10];
    for &l in labels {
        c[l as usize] += 1;
    }
    c
}

#[test]
fn all_rows_and_first_row() {
    let all = digits::load_all().unwrap();
    assert_eq!(all.len(), 1797);
    assert_eq!(all.dim(), 64);
    assert_eq!(all.num_classes(), 10);
    let expected: Vec<f32> = FIRST_ROW.iter().map(|&p| p as f32 / 16.0).collect();
    assert_eq!(all.row(0).unwrap(), expected.as_slice());
    assert_eq!(all.labels()[0], FIRST_LABEL);
    assert_eq!(all.labels()[1796], LAST_LABEL);
}

#[test]
fn canonical_split() {
    let split = digits::load().unwrap();
    assert_eq!((split.train.len(), split.test.len()), (1437, 360));
    assert_eq!(split.test.num_classes(), 10);
    assert_eq!(counts(split.test.labels()), TEST_LABEL_COUNTS);
    assert_eq!(counts(split.train.labels()), TRAIN_LABEL_COUNTS);
    let prefix: Vec<f32> = FIRST_TEST_ROW_PREFIX
        .iter()
        .map(|&p| p as f32 / 16.0)
        .collect();
    assert_eq!(&split.test.row(0).unwrap()[..8], prefix.as_slice());
    assert_eq!(split.test.labels()[0], FIRST_TEST_LABEL);
    let sum: f64 = split.train.features().iter().map(|&v| f64::from(v)).sum();
    assert_eq!(sum, TRAIN_PIXEL_SUM / 16.0);
    assert!(
        split
            .train
            .features()
            .iter()
            .all(|&v| (0.0..=1.0).contains(&v))
    );
}

#[test]
fn parse_errors_name_line_and_value() {
    let good = format!("{}5\n", "0,".repeat(64));
    assert_eq!(digits::parse_csv(&good).unwrap().labels(), &[5]);

    let short = format!("{}\n{}3\n", good.trim_end(), "1,".repeat(10));
    match digits::parse_csv(&short) {
        Err(DataError::DigitsParse { line: 2, problem }) => {
            assert!(
                problem.contains("65") && problem.contains("11"),
                "{problem}"
            )
        }
        other => panic!("expected a line-2 parse error, got {other:?}"),
    }
    let bad_pixel = format!("17,{}5", "0,".repeat(63));
    let err = digits::parse_csv(&bad_pixel).unwrap_err().to_string();
    assert!(
        err.contains("line 1") && err.contains("\"17\"") && err.contains("0..=16"),
        "{err}"
    );
    let bad_label = format!("{}10", "0,".repeat(64));
    let err = digits::parse_csv(&bad_label).unwrap_err().to_string();
    assert!(err.contains("label") && err.contains("\"10\""), "{err}");
    let not_number = format!("x,{}5", "0,".repeat(63));
    assert!(
        digits::parse_csv(&not_number)
            .unwrap_err()
            .to_string()
            .contains("not a number")
    );
}
