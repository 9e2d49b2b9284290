//! The book's configuration reference (`book/src/configuration.md`) is generated from the
//! settings' one declaration: the `settings!` list in `trainer/src/config.rs`, whose docs are
//! also the `--help` text of `localsgd train`.
//!
//! - The chapter's region between the `<!-- generated: settings begin … -->` and
//!   `<!-- generated: settings end -->` lines must equal [`reference`]'s rendering of
//!   [`SETTINGS`] byte for byte. After changing a setting, rewrite the region with
//!
//!   ```text
//!   LOCALSGD_BLESS=1 cargo test --workspace --test trainer_it book_config
//!   ```
//!
//!   (the test then passes and says so); commit the chapter with the change.
//! - The name checks guard the rest: every `TrainConfig` key and every `localsgd train` flag
//!   (except `--config`) has a table row starting with "| `setting-name` |", every such row is a
//!   real setting, and the flags' `--help` text is each setting's doc.

use clap::Args;
use localsgd_trainer::config::ConfigFlags;
use localsgd_trainer::config::{SETTINGS, SettingDoc, TrainConfig};
use std::collections::BTreeSet;
use std::path::PathBuf;

const BEGIN: &str = "<!-- generated: settings begin";
const END: &str = "<!-- generated: settings end -->";

/// The chapters a doc may point to as `(book: Chapter)` or `(book: Chapter, "Heading")`.
const CHAPTERS: &[(&str, &str)] = &[
    ("Averagers", "averagers.md"),
    ("Concepts", "concepts.md"),
    ("Fault tolerance", "fault-tolerance.md"),
    ("GPUs", "gpu.md"),
    ("Hooks", "hooks.md"),
    ("MPI", "mpi.md"),
    ("Performance", "performance.md"),
    ("Reproducing a PyTorch run", "reproducing-pytorch.md"),
    ("Semantics", "semantics.md"),
    ("Training a language model", "language-model.md"),
    ("The localsgd binary", "binary.md"),
];

fn book_src() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../book/src")
}

fn chapter_path() -> PathBuf {
    book_src().join("configuration.md")
}

/// The chapter as it is on disk now (read at run time, so a blessed chapter is seen at once).
fn chapter() -> String {
    std::fs::read_to_string(chapter_path()).expect("book/src/configuration.md")
}

/// The clap arguments of `localsgd train`'s settings (all but `--config` and `--help`).
fn flag_args() -> Vec<clap::Arg> {
    ConfigFlags::augment_args(clap::Command::new("t"))
        .get_arguments()
        .filter(|a| a.get_long().is_some_and(|l| l != "config"))
        .cloned()
        .collect()
}

fn flag_arg(name: &str) -> clap::Arg {
    flag_args()
        .into_iter()
        .find(|a| a.get_long() == Some(name))
        .unwrap_or_else(|| panic!("no flag --{name}"))
}

/// The values of an enum setting's flag with their help (the variants' docs), as `--help` lists
/// them; empty for the other settings (a `bool` flag's `true`/`false` are not listed).
fn enum_values(name: &str) -> Vec<(String, String)> {
    let values: Vec<(String, String)> = flag_arg(name)
        .get_possible_values()
        .into_iter()
        .map(|v| {
            let help = v.get_help().map(|h| h.to_string()).unwrap_or_default();
            (v.get_name().to_string(), help)
        })
        .collect();
    let names: Vec<&str> = values.iter().map(|(n, _)| n.as_str()).collect();
    if names == ["true", "false"] {
        Vec::new()
    } else {
        values
    }
}

/// The anchors of a chapter's headings, as mdBook makes them (and `scripts/check-book-links.sh`
/// checks them): lowercase, spaces to `-`, other characters than letters, digits, `-` and `_`
/// removed; fenced code skipped.
fn anchors(chapter: &str) -> Vec<String> {
    let text = std::fs::read_to_string(book_src().join(chapter))
        .unwrap_or_else(|e| panic!("book/src/{chapter}: {e}"));
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            out.push(anchor(line[hashes..].trim().trim_end_matches('#').trim()));
        }
    }
    out
}

fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .replace(' ', "-")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect()
}

/// `text` with every `(book: Chapter)` and `(book: Chapter, "Heading")` made a link to that
/// chapter (and heading), checked to exist.
fn link_pointers(text: &str) -> String {
    const OPEN: &str = "(book: ";
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        let (chapter, heading, len) = match (after.find(", \""), after.find(')')) {
            (Some(comma), Some(close)) if comma < close => {
                let heading_start = comma + 3;
                let heading_len = after[heading_start..]
                    .find("\")")
                    .unwrap_or_else(|| panic!("unclosed book pointer in {text:?}"));
                let heading = &after[heading_start..heading_start + heading_len];
                (
                    &after[..comma],
                    Some(heading),
                    heading_start + heading_len + 2,
                )
            }
            (_, Some(close)) => (&after[..close], None, close + 1),
            _ => panic!("unclosed book pointer in {text:?}"),
        };
        let file = CHAPTERS
            .iter()
            .find(|(name, _)| *name == chapter)
            .unwrap_or_else(|| {
                panic!(
                    "a doc points to the book's chapter {chapter:?}; known: {:?} (add it to \
                     CHAPTERS in trainer/tests/it/book_config.rs)",
                    CHAPTERS.iter().map(|c| c.0).collect::<Vec<_>>()
                )
            })
            .1;
        match heading {
            Some(heading) => {
                let id = anchor(heading);
                assert!(
                    anchors(file).contains(&id),
                    "a doc points to the heading {heading:?} of book/src/{file}, which has none \
                     giving the anchor #{id}"
                );
                out.push_str(&format!("(see [{heading}]({file}#{id}))"));
            }
            None => out.push_str(&format!("(see [{chapter}]({file}))")),
        }
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// A rustdoc intra-doc link "[`Item`]" (in an enum variant's doc, which `--help` shows too)
/// written as plain code, as markdown has no target for it.
fn strip_intra_doc_links(text: &str) -> String {
    let mut out = text.to_string();
    while let Some(start) = out.find("[`") {
        let Some(len) = out[start..].find("`]") else {
            break;
        };
        let end = start + len + 2;
        if out[end..].starts_with('(') {
            break;
        }
        out.replace_range(end - 1..end, "");
        out.replace_range(start..start + 1, "");
    }
    out
}

/// A table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The Default column: the value of `TrainConfig::default()` as the TOML file writes it
/// (strings without quotes, but `""`), or "unset" (with what that means) for an optional one.
fn default_text(setting: &SettingDoc, defaults: &toml::Table) -> String {
    match defaults.get(&setting.name()) {
        None => match setting.unset {
            Some(meaning) => format!("unset ({meaning})"),
            None => "unset".to_string(),
        },
        Some(toml::Value::String(s)) if s.is_empty() => "`\"\"`".to_string(),
        Some(toml::Value::String(s)) => format!("`{s}`"),
        Some(value) => format!("`{value}`"),
    }
}

/// The Meaning column: the doc's paragraphs, then an enum's values with their docs.
fn meaning(setting: &SettingDoc) -> String {
    let mut text = setting.paragraphs().join(" ");
    for (value, help) in enum_values(&setting.name()) {
        let help = strip_intra_doc_links(&help);
        let stop = if help.ends_with(['.', '?', '!']) {
            ""
        } else {
            "."
        };
        text.push_str(&format!("<br>`{value}`: {help}{stop}"));
    }
    link_pointers(&text)
}

/// The generated region of the chapter: one table per section, in the list's order.
fn reference() -> String {
    let defaults: toml::Table = TrainConfig::default().to_toml().parse().unwrap();
    let mut out = String::from("\n");
    for (i, s) in SETTINGS.iter().enumerate() {
        if i == 0 || SETTINGS[i - 1].section != s.section {
            out.push_str(&format!(
                "## {}\n\n| Setting | Type | Default | Meaning |\n|---|---|---|---|\n",
                s.section
            ));
        }
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            s.name(),
            cell(s.type_text),
            default_text(s, &defaults),
            cell(&meaning(s)),
        ));
        if SETTINGS
            .get(i + 1)
            .is_none_or(|next| next.section != s.section)
        {
            out.push('\n');
        }
    }
    out
}

/// The chapter split around its generated region: (before, region, after), the markers in
/// before and after.
fn split_chapter(text: &str) -> (&str, &str, &str) {
    let begin = text
        .find(BEGIN)
        .unwrap_or_else(|| panic!("book/src/configuration.md has no line {BEGIN:?} … -->"));
    let region_start = begin + text[begin..].find("-->\n").expect("the begin marker's -->") + 4;
    let end = text
        .find(END)
        .unwrap_or_else(|| panic!("book/src/configuration.md has no line {END:?}"));
    assert!(
        end >= region_start,
        "the end marker comes before the begin marker"
    );
    (
        &text[..region_start],
        &text[region_start..end],
        &text[end..],
    )
}

/// The lines where `book` and `generated` differ, numbered as in the chapter; of each, the
/// stretch around its first differing character (table rows are long).
fn line_diff(book: &str, generated: &str, first_line: usize) -> String {
    let (b, g): (Vec<&str>, Vec<&str>) = (book.lines().collect(), generated.lines().collect());
    let mut out = String::new();
    let mut shown = 0;
    for i in 0..b.len().max(g.len()) {
        let (x, y) = (b.get(i).copied(), g.get(i).copied());
        if x == y {
            continue;
        }
        let (xc, yc): (Vec<char>, Vec<char>) = (
            x.unwrap_or("").chars().collect(),
            y.unwrap_or("").chars().collect(),
        );
        let column = xc.iter().zip(&yc).take_while(|(p, q)| p == q).count();
        let from = column.saturating_sub(40);
        let stretch = |line: Option<&str>, chars: &[char]| match line {
            None => "(no line)".to_string(),
            Some(_) => {
                let to = (column + 80).min(chars.len());
                let text: String = chars[from..to.max(from)].iter().collect();
                let head = if from > 0 { "…" } else { "" };
                let tail = if to < chars.len() { "…" } else { "" };
                format!("{head}{text}{tail}")
            }
        };
        out.push_str(&format!(
            "line {}, column {}:\n  - book:      {}\n  + generated: {}\n",
            first_line + i,
            column + 1,
            stretch(x, &xc),
            stretch(y, &yc)
        ));
        shown += 1;
        if shown == 10 {
            out.push_str("  … (more lines differ)\n");
            break;
        }
    }
    out
}

#[test]
fn the_reference_is_generated_from_the_settings() {
    let text = chapter();
    let (before, region, after) = split_chapter(&text);
    let generated = reference();
    if region == generated {
        return;
    }
    if std::env::var("LOCALSGD_BLESS").as_deref() == Ok("1") {
        // Through a temporary file and a rename, so a test reading the chapter meanwhile sees
        // the old or the new one, never half of it.
        let tmp = chapter_path().with_extension("md.blessing");
        std::fs::write(&tmp, format!("{before}{generated}{after}")).unwrap();
        std::fs::rename(&tmp, chapter_path()).unwrap();
        eprintln!("LOCALSGD_BLESS=1: rewrote the settings tables of book/src/configuration.md");
        return;
    }
    let first_line = before.lines().count() + 1;
    panic!(
        "book/src/configuration.md's settings tables differ from the settings' docs in \
         trainer/src/config.rs:\n{}\nEdit the docs in the `settings!` list, not the book, then \
         regenerate the tables with\n  LOCALSGD_BLESS=1 cargo test --workspace --test trainer_it \
         book_config",
        line_diff(region, &generated, first_line)
    );
}

#[test]
fn help_shows_each_settings_doc() {
    for s in SETTINGS {
        let arg = flag_arg(&s.name());
        let paragraphs = s.paragraphs();
        let shown = match arg.get_long_help() {
            Some(long) => long.to_string(),
            // clap drops a one-paragraph doc's final period.
            None => format!("{}.", arg.get_help().expect("a doc")),
        };
        assert_eq!(shown, paragraphs.join("\n\n"), "--{}", s.name());
        assert_eq!(
            arg.get_help_heading(),
            Some(s.section),
            "--{}'s help heading",
            s.name()
        );
    }
}

#[test]
fn docs_read_as_plain_text_with_a_one_sentence_summary() {
    for s in SETTINGS {
        let name = s.name();
        let doc = s.paragraphs().join("\n\n");
        assert!(
            !doc.contains("](") && !doc.contains("[`"),
            "`{name}`'s doc has a markdown or rustdoc link, which `--help` shows raw; point to \
             the book as (book: Chapter, \"Heading\")"
        );
        let summary = s.summary();
        assert!(
            summary.ends_with('.'),
            "`{name}`'s summary {summary:?} ends without a period"
        );
        let body = &summary[..summary.len() - 1];
        let second = body
            .match_indices(". ")
            .find(|(i, _)| body[i + 2..].starts_with(|c: char| c.is_uppercase()));
        assert!(
            second.is_none(),
            "`{name}`'s summary {summary:?} is more than one sentence: end the first paragraph \
             after it"
        );
    }
}

#[test]
fn enum_types_list_the_flag_values() {
    for s in SETTINGS {
        let values = enum_values(&s.name());
        if values.is_empty() {
            continue;
        }
        let listed: Vec<String> = values.iter().map(|(v, _)| format!("`{v}`")).collect();
        let listed = listed.join(" | ");
        assert!(
            s.type_text == listed || s.type_text == format!("{listed}, optional"),
            "`{}`'s type {:?} should list its values: {listed:?}",
            s.name(),
            s.type_text
        );
    }
}

#[test]
fn the_settings_list_is_the_config_keys() {
    let names: BTreeSet<String> = SETTINGS.iter().map(SettingDoc::name).collect();
    assert_eq!(names.len(), SETTINGS.len(), "a setting is listed twice");
    assert_eq!(names, config_keys());
}

/// Names of the table rows "| `name` | ..." of the chapter.
fn documented() -> BTreeSet<String> {
    chapter()
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
    flag_args()
        .iter()
        .filter_map(|a| a.get_long().map(str::to_string))
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
