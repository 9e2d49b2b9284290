//! Cross-crate tests of localsgd live in `tests/`: they exercise the trainer end to end the way
//! a user does (default settings, several algorithms) rather than one crate at a time.
