//! What a store can keep: checks run before an event (or a staged message) is accepted, so a
//! value a store cannot hold is refused at the call that offers it, before a seq is assigned,
//! instead of failing a whole batch at commit.
//!
//! PostgreSQL `text` cannot hold NUL (U+0000). Event types go into a `text` column as they are,
//! so NUL in an event type is refused by every store ([`check_type`], run by the log for every
//! append whatever its backend): one contract, so a session can move between stores. Enqueued
//! message ids go into a `text` column of the PostgreSQL store only, which refuses NUL there.
//! Payloads are stored as JSON text, where NUL is always the escape `\u0000` (legal in `text`);
//! the PostgreSQL store never casts a record to `jsonb` (which refuses that escape), so
//! payloads holding NUL are kept by every store.

use super::LogError;

/// Refuses `value` (naming it, and what it is) if it holds NUL, which PostgreSQL `text` cannot.
pub fn check_text(what: &str, value: &str) -> Result<(), LogError> {
    match value.contains('\0') {
        true => Err(LogError::Unstorable(format!("{what} {value:?} contains NUL (U+0000), which PostgreSQL text cannot hold"))),
        false => Ok(()),
    }
}

/// Refuses an event type holding NUL, in every store (PostgreSQL `text` cannot hold it, and
/// the stores keep one contract), naming the type.
pub fn check_type(kind: &str) -> Result<(), LogError> {
    match kind.contains('\0') {
        true => Err(LogError::Unstorable(format!(
            "event type {kind:?} contains NUL (U+0000), which no store keeps (PostgreSQL text cannot hold it)"
        ))),
        false => Ok(()),
    }
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
        assert!(check_type("a/b").is_ok());
        let e = check_type("a\0b").unwrap_err().to_string();
        assert!(e.contains("event type \"a\\0b\" contains NUL"), "{e}");
        assert!(check_text("message id", "m\u{1}\"\\").is_ok());
    }
}
