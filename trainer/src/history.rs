//! The layout of a run's `config.toml`: its settings, then one `[[resumed]]` table per resume
//! that changed a setting (the history), and the split between the two that both the settings
//! parser and the resume check read.

/// The key of `config.toml`'s history tables: one `[[resumed]]` table per resume that changed
/// a setting.
pub const HISTORY_KEY: &str = "resumed";

/// The text of `config.toml`'s settings: everything before its first `[[resumed]]` table
/// (the history follows the settings, which have no tables of their own), so that an error
/// in a setting names its line of the file.
pub fn settings_text(text: &str) -> &str {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let head = line.trim_start();
        if head.starts_with(&format!("[[{HISTORY_KEY}]]"))
            || head.starts_with(&format!("[{HISTORY_KEY}."))
        {
            return &text[..offset];
        }
        offset += line.len();
    }
    text
}

/// Split `config.toml`'s text into its settings and its `[[resumed]]` history.
pub fn split_history(text: &str) -> Result<(toml::Table, Vec<toml::Table>), String> {
    let mut table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    let history = match table.remove(HISTORY_KEY) {
        None => Vec::new(),
        Some(toml::Value::Array(entries)) => entries
            .into_iter()
            .map(|e| match e {
                toml::Value::Table(t) => {
                    match t.keys().find(|k| !HISTORY_FIELDS.contains(&k.as_str())) {
                        Some(key) => Err(format!(
                            "`{key}` stands below a `[[{HISTORY_KEY}]]` table, so TOML reads it as \
                         part of the run's history, not as a setting: move it above the first \
                         `[[{HISTORY_KEY}]]` line"
                        )),
                        None => Ok(t),
                    }
                }
                _ => Err(history_error()),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(history_error()),
    };
    // The last table's settings hold from its iteration on: the file's settings say the same,
    // unless a line written below the history landed in that table.
    if let Some(toml::Value::Table(last)) = history.last().and_then(|h| h.get("settings")) {
        for (key, value) in last {
            let unset = value.as_str() == Some("(unset)");
            let agrees = match table.get(key) {
                Some(v) => v == value,
                None => unset,
            };
            if !agrees {
                return Err(format!(
                    "the last `[[{HISTORY_KEY}]]` table says `{key}` = {value} from its \
                     iteration on, but the file's settings say {}: a line written below the \
                     history lands in that table; write settings above the first \
                     `[[{HISTORY_KEY}]]` line (a resume, not an edit, changes a run's settings)",
                    table
                        .get(key)
                        .map_or_else(|| "(unset)".to_string(), toml::Value::to_string)
                ));
            }
        }
    }
    Ok((table, history))
}

/// The keys a `[[resumed]]` table has: a key anywhere else in it is a setting written below
/// the history, where TOML puts it into the last table.
const HISTORY_FIELDS: [&str; 3] = ["iteration", "settings", "before"];

fn history_error() -> String {
    format!(
        "`{HISTORY_KEY}` is the history of a resumed run's settings: `[[{HISTORY_KEY}]]` tables, \
         as `localsgd train --resume` writes them"
    )
}
