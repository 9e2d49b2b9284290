//! With the feature `libtorch`: a run-time search path (rpath) to LibTorch's shared libraries in
//! this package's binaries, tests and examples, so that they start without `LD_LIBRARY_PATH`.
//! `torch-sys` links LibTorch dynamically and sets none. The libraries are where `torch-sys`
//! takes them from: the Python package's (`LIBTORCH_USE_PYTORCH`), `LIBTORCH_LIB/lib`, or
//! `LIBTORCH/lib`; a LibTorch that `torch-sys` downloaded itself gets no rpath (the book says to
//! set `LD_LIBRARY_PATH` then). The trainer's and the learner's build scripts include the same
//! file.

include!("libtorch_rpath.rs");
