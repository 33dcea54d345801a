//! What a store can keep: checks a backend runs before an event (or a staged message) is
//! accepted, so a value the store cannot hold is refused at the call that offers it, before a
//! seq is assigned, instead of failing a whole batch at commit.
//!
//! PostgreSQL `text` cannot hold NUL (U+0000). Event types and message ids go into `text`
//! columns as they are, so NUL there is refused. Payloads are stored as JSON text, where NUL is
//! always the escape `\u0000` (legal in `text`); the store never casts a record to `jsonb`
//! (which refuses that escape), so payloads holding NUL are kept, as by the other stores.

use super::LogError;

/// Refuses `value` (naming it, and what it is) if it holds NUL, which PostgreSQL `text` cannot.
pub fn check_text(what: &str, value: &str) -> Result<(), LogError> {
    match value.contains('\0') {
        true => Err(LogError::Unstorable(format!("{what} {value:?} contains NUL (U+0000), which PostgreSQL text cannot hold"))),
        false => Ok(()),
    }
}

/// Whether the PostgreSQL store can keep an event of type `kind`.
pub fn check_pg_type(kind: &str) -> Result<(), LogError> {
    check_text("event type", kind)
}

/// The longest id (session or message) the PostgreSQL store keeps, in UTF-8 bytes: ids are
/// primary-key columns, and a btree entry holds at most 2704 bytes (a session id and a message
/// id together in the staged table's key).
pub const MAX_PG_ID_BYTES: usize = 1024;

/// Refuses an id longer than [`MAX_PG_ID_BYTES`]; the message shows its start and its length.
pub fn check_pg_id(what: &str, id: &str) -> Result<(), String> {
    if id.len() <= MAX_PG_ID_BYTES {
        return Ok(());
    }
    let start: String = id.chars().take(32).collect();
    Err(format!("{what} {start:?}… is {} bytes long (at most {MAX_PG_ID_BYTES})", id.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_is_refused_naming_the_value() {
        assert!(check_pg_type("a/b").is_ok());
        let e = check_pg_type("a\0b").unwrap_err().to_string();
        assert!(e.contains("event type \"a\\0b\""), "{e}");
        assert!(check_text("message id", "m\u{1}\"\\").is_ok());
    }
}
