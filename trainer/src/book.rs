//! The book's chapters (`book/src/*.md`) as doctests: every ```rust block in them is compiled and
//! run by `cargo test -p localsgd-trainer --doc`, so the book cannot drift from the code. Only
//! compiled for doctests (`#[cfg(doctest)] pub mod book;` in `lib.rs`).

#[doc = include_str!("../../book/src/concepts.md")]
pub struct Concepts;

#[doc = include_str!("../../book/src/comm.md")]
pub struct Comm;

#[doc = include_str!("../../book/src/hooks.md")]
pub struct Hooks;

#[doc = include_str!("../../book/src/averagers.md")]
pub struct Averagers;

#[doc = include_str!("../../book/src/pipeline.md")]
pub struct PipelineChapter;
