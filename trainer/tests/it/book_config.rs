//! The book's configuration reference (`book/src/configuration.md`) lists exactly the settings the
//! binary has: every `TrainConfig` key and every `localsgd train` flag (except `--config`) has a
//! table row starting with "| `setting-name` |", and every such row is a real setting.

use clap::Args;
use localsgd_trainer::cli::ConfigFlags;
use localsgd_trainer::config::TrainConfig;
use std::collections::BTreeSet;

const CHAPTER: &str = include_str!("../../../book/src/configuration.md");

/// Names of the table rows "| `name` | ..." of the chapter.
fn documented() -> BTreeSet<String> {
    CHAPTER
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once("` |"))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Every key of the TOML file (`Option` settings serialize as null, so they are included).
fn config_keys() -> BTreeSet<String> {
    let value = serde_json::to_value(TrainConfig::default()).unwrap();
    value.as_object().unwrap().keys().cloned().collect()
}

/// Every long flag of `localsgd train`, minus `--config` (the file itself, not a setting).
fn flag_names() -> BTreeSet<String> {
    ConfigFlags::augment_args(clap::Command::new("t"))
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .filter(|name| name != "config")
        .collect()
}

fn differences(what: &str, actual: &BTreeSet<String>, book: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for name in actual.difference(book) {
        out.push(format!(
            "{what} `{name}` has no row in book/src/configuration.md"
        ));
    }
    for name in book.difference(actual) {
        out.push(format!(
            "book/src/configuration.md documents `{name}`, which is not a {what}"
        ));
    }
    out
}

#[test]
fn the_chapter_has_a_table() {
    // Guards the parser: an empty set would make the comparisons below vacuous.
    assert!(documented().len() >= 30, "found only {:?}", documented());
}

#[test]
fn every_config_key_is_documented_and_nothing_else() {
    let diff = differences("TrainConfig key", &config_keys(), &documented());
    assert!(diff.is_empty(), "{}", diff.join("\n"));
}

#[test]
fn every_flag_is_documented_and_nothing_else() {
    let diff = differences("`localsgd train` flag", &flag_names(), &documented());
    assert!(diff.is_empty(), "{}", diff.join("\n"));
}
