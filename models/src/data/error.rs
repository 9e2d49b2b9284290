//! The error type of the [`crate::data`] module.

use std::path::PathBuf;

/// Everything that can go wrong while loading, generating, sharding or batching data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A dataset was built from inconsistent parts.
    #[error("invalid dataset: {0}")]
    InvalidDataset(String),

    /// The data asked for would not fit in this machine's memory.
    #[error(transparent)]
    TooLarge(#[from] crate::limits::TooLarge),

    /// A line of the bundled digits CSV could not be parsed.
    #[error("digits.csv line {line}: {problem}")]
    DigitsParse {
        /// 1-based line number in the decompressed CSV.
        line: usize,
        /// What was wrong with that line.
        problem: String,
    },

    /// A gzip stream could not be decompressed.
    #[error("cannot decompress {what}: {source}")]
    Gzip {
        /// The file or resource being decompressed.
        what: String,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// None of the accepted file names of an IDX file exists.
    #[error("missing IDX file: none of {tried:?} exists")]
    MissingFile {
        /// Every path that was looked for (plain name, then `.gz`).
        tried: Vec<PathBuf>,
    },

    /// An IDX file exists but cannot be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// An IDX file starts with the wrong magic number.
    #[error("{path}: bad IDX magic {found:#010x}, expected {expected:#010x} ({kind})")]
    BadMagic {
        /// The offending file.
        path: PathBuf,
        /// The magic number read from the file.
        found: u32,
        /// The magic number this kind of file must have.
        expected: u32,
        /// `"images"` or `"labels"`.
        kind: &'static str,
    },

    /// An IDX file is shorter than its header says.
    #[error("{path}: truncated IDX file: expected {expected} bytes, found {found}")]
    Truncated {
        /// The offending file.
        path: PathBuf,
        /// Byte length implied by the header (header included).
        expected: usize,
        /// Actual byte length (after decompression).
        found: usize,
    },

    /// An IDX file is longer than its header says.
    #[error("{path}: IDX file has {extra} unexpected trailing bytes after {expected} bytes")]
    TrailingBytes {
        /// The offending file.
        path: PathBuf,
        /// Byte length implied by the header (header included).
        expected: usize,
        /// Number of bytes beyond that length.
        extra: usize,
    },

    /// An images file and its labels file disagree on the number of samples.
    #[error("{images} holds {num_images} images but {labels} holds {num_labels} labels")]
    CountMismatch {
        /// The images file.
        images: PathBuf,
        /// Number of images in it.
        num_images: usize,
        /// The labels file.
        labels: PathBuf,
        /// Number of labels in it.
        num_labels: usize,
    },

    /// A sampler was configured with an impossible world size or rank.
    #[error(
        "invalid sampler: rank {rank} with world size {world} (need world >= 1 and rank < world)"
    )]
    InvalidSampler {
        /// The requested world size.
        world: usize,
        /// The requested rank.
        rank: usize,
    },

    /// A batch size of zero was requested.
    #[error("batch size must be positive, got 0")]
    ZeroBatchSize,

    /// A text file (of the `text` data set) is missing or cannot be read.
    #[error("cannot read text file `{path}`: {source}")]
    TextRead {
        /// The file that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A text (of the `text` data set) has no bytes.
    #[error(
        "{what} is empty: a text data set needs at least one window of context + 1 bytes in both \
         its training and its validation part"
    )]
    EmptyText {
        /// The text: `` text file `PATH` `` or `the text`.
        what: String,
    },

    /// A text data set's context was 0.
    #[error(
        "invalid context {context}: the context must be at least 1 byte (a window holds context \
         + 1 bytes)"
    )]
    InvalidContext {
        /// The context asked for.
        context: usize,
    },

    /// A text data set's validation fraction was not strictly between 0 and 1.
    #[error(
        "invalid validation fraction {value}: it must be a number strictly between 0 and 1 (the \
         held-out share of the text's bytes; the default is 0.1)"
    )]
    InvalidValidFraction {
        /// The fraction asked for.
        value: f64,
    },

    /// A text, its training part or its validation part is shorter than one window.
    #[error(
        "{what} is too short for context {context} and validation fraction {valid_fraction}: \
         {part} has {part_bytes} bytes, fewer than one window of context + 1 = {} bytes; these \
         settings need at least {needed} bytes in all and {what} has {bytes}: use a longer text \
         or a smaller `context`",
        context.saturating_add(1)
    )]
    TextTooShort {
        /// The text: `` text file `PATH` `` or `the text`.
        what: String,
        /// Which part is too short, with its extent.
        part: String,
        /// Bytes in that part.
        part_bytes: usize,
        /// Bytes in the whole text.
        bytes: usize,
        /// The context asked for.
        context: usize,
        /// The validation fraction asked for.
        valid_fraction: f64,
        /// The fewest bytes whose training and validation parts both hold one window.
        needed: u64,
    },

    /// A batch referred to a row that does not exist.
    #[error("row index {index} out of range for a dataset of {len} rows")]
    IndexOutOfRange {
        /// The offending index.
        index: usize,
        /// Number of rows in the dataset.
        len: usize,
    },
}
