//! SVG loss curves: structure, coordinates inside the viewBox, non-finite values skipped.

use localsgd_trainer::plot::{HEIGHT, WIDTH, loss_svg, write_loss_svg};

/// The `points="..."` of every polyline, parsed.
fn polylines(svg: &str) -> Vec<Vec<(f64, f64)>> {
    svg.split("<polyline")
        .skip(1)
        .map(|rest| {
            let start = rest.find("points=\"").unwrap() + 8;
            let end = start + rest[start..].find('"').unwrap();
            rest[start..end]
                .split_whitespace()
                .map(|pair| {
                    let (x, y) = pair.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

#[test]
fn writes_one_polyline_per_series_inside_the_viewbox() {
    let series = vec![
        (
            "rank 0".to_string(),
            vec![(0.0, 2.3), (10.0, 1.2), (20.0, 0.7)],
        ),
        (
            "rank 1".to_string(),
            vec![(0.0, 2.4), (10.0, 1.0), (20.0, 0.5), (30.0, 0.45)],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loss.svg");
    write_loss_svg(&path, &series, "loss <per> rank").unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains(&format!("viewBox=\"0 0 {WIDTH} {HEIGHT}\"")));
    assert!(
        svg.contains("loss &lt;per&gt; rank"),
        "title must be escaped"
    );
    assert!(
        svg.contains(">rank 0<") && svg.contains(">rank 1<"),
        "legend entries"
    );
    let lines = polylines(&svg);
    assert_eq!(lines.len(), 2);
    assert_eq!((lines[0].len(), lines[1].len()), (3, 4));
    for &(x, y) in lines.iter().flatten() {
        assert!(
            (0.0..=WIDTH).contains(&x) && (0.0..=HEIGHT).contains(&y),
            "({x}, {y})"
        );
    }
    // Larger loss is drawn higher up (smaller y); later steps further right.
    assert!(lines[0][0].1 < lines[0][2].1);
    assert!(lines[1][0].0 < lines[1][3].0);
    // Tick labels: the x range 0..30 gets round ticks.
    assert!(svg.contains(">0<") && svg.contains(">30<"), "x tick labels");
}

#[test]
fn non_finite_points_are_skipped() {
    let series = vec![
        (
            "a".to_string(),
            vec![
                (0.0, 1.0),
                (1.0, f64::NAN),
                (2.0, f64::INFINITY),
                (3.0, 0.5),
            ],
        ),
        ("all nan".to_string(), vec![(0.0, f64::NAN)]),
    ];
    let svg = loss_svg(&series, "t");
    let lines = polylines(&svg);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].len(), 2);
    assert!(svg.contains("all nan (no data)"));
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
}

#[test]
fn empty_and_constant_series_still_render() {
    let svg = loss_svg(&[], "nothing");
    assert!(svg.starts_with("<svg") && svg.contains("</svg>"));
    assert!(polylines(&svg).is_empty());

    let flat = vec![("flat".to_string(), vec![(5.0, 0.3), (5.0, 0.3)])];
    let lines = polylines(&loss_svg(&flat, "flat"));
    assert_eq!(lines.len(), 1);
    for &(x, y) in &lines[0] {
        assert!(x.is_finite() && y.is_finite());
        assert!((0.0..=WIDTH).contains(&x) && (0.0..=HEIGHT).contains(&y));
    }
}

#[test]
fn unwritable_path_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing-dir").join("loss.svg");
    let err = write_loss_svg(&path, &[], "t").unwrap_err();
    assert!(err.to_string().contains("missing-dir"));
}
