//! The syntax of the list settings (`hidden`, `channels`, `resume-ranks`): comma-separated
//! non-negative integers, `""` for none, the same on the command line and in the config file.

/// Layer widths as given on the command line: comma-separated, `""` for none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Widths(pub Vec<usize>);

impl From<Widths> for Vec<usize> {
    fn from(w: Widths) -> Self {
        w.0
    }
}

/// Parse `128,64` (spaces allowed around the commas) or `""` (no layers) into [`Widths`].
pub fn parse_widths(s: &str) -> Result<Widths, String> {
    parse_list(
        s,
        "a width: expected comma-separated non-negative integers, e.g. 128,64, or \"\" for no hidden layer",
    )
}

/// Parse a comma-separated list of saved ranks (`0,2,3`) for `--resume-ranks`; `""` for
/// none.
pub fn parse_ranks(s: &str) -> Result<Widths, String> {
    parse_list(
        s,
        "a rank: expected the saved ranks each worker continues from, comma-separated non-negative integers, e.g. 0,2,3",
    )
}

/// Comma-separated non-negative integers (`""`: none); a bad entry is "`part` is not `what`".
fn parse_list(s: &str, what: &str) -> Result<Widths, String> {
    if s.trim().is_empty() {
        return Ok(Widths(Vec::new()));
    }
    s.split(',')
        .map(|part| {
            part.trim()
                .parse::<usize>()
                .map_err(|_| format!("{part:?} is not {what}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Widths)
}
