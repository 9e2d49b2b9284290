//! LibTorch's rpath for this crate's binaries, tests and examples with the feature `libtorch`:
//! the pipeline crate's build script (pipeline/build.rs says what it does).

include!("../pipeline/libtorch_rpath.rs");
