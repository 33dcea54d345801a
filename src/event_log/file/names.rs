//! Session ids as file names.
//!
//! Every UTF-8 byte of an id outside `[A-Za-z0-9_-]` is written as `~XX` (uppercase hex). The
//! encoded name therefore never contains `/`, `.`, NUL or control characters, can never be `.`
//! or `..`, and never starts with `.` — which leaves names starting with `.` free for our own
//! hidden temporary files. The encoding is a bijection onto its canonical outputs, so `list`
//! can decode names back to ids and ignore anything we did not write.

use super::super::LogError;

/// The suffix of a session file.
pub(super) const SUFFIX: &str = ".jsonl";

/// The longest session file name we create (most file systems allow 255 bytes; the rest is
/// headroom for the temporary and `.corrupt.N` names derived from it).
pub(super) const MAX_FILE_NAME: usize = 240;

fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The encoded form of `id` (without the suffix).
pub(super) fn encode(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for &b in id.as_bytes() {
        if is_plain(b) {
            out.push(b as char);
        } else {
            out.push('~');
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xF) as usize] as char);
        }
    }
    out
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The id an encoded name (without the suffix) stands for, if it is a canonical encoding of a
/// usable id. Non-canonical spellings (`~41` for `A`, lowercase hex) are refused so that each
/// id has exactly one file.
pub(super) fn decode(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if is_plain(b) {
            out.push(b);
            i += 1;
        } else if b == b'~' && i + 2 < bytes.len() {
            let v = hex_value(bytes[i + 1])? << 4 | hex_value(bytes[i + 2])?;
            if is_plain(v) {
                return None;
            }
            out.push(v);
            i += 3;
        } else {
            return None;
        }
    }
    let id = String::from_utf8(out).ok()?;
    if id.is_empty() || id.contains('\0') {
        return None;
    }
    Some(id)
}

/// Whether Windows takes `stem` (a name before its first dot) for a device, whatever follows
/// the dot: `NUL.jsonl` is the null device there.
fn is_windows_device(stem: &str) -> bool {
    let upper = stem.to_ascii_uppercase();
    match upper.as_bytes() {
        [b'C', b'O', b'N'] | [b'P', b'R', b'N'] | [b'A', b'U', b'X'] | [b'N', b'U', b'L'] => true,
        [b'C', b'O', b'M', d] | [b'L', b'P', b'T', d] => (b'1'..=b'9').contains(d),
        _ => false,
    }
}

/// The session file name of `id`, or `InvalidId` if it would be too long (or, on Windows, a
/// device's name).
pub(super) fn file_name(id: &str) -> Result<String, LogError> {
    let stem = encode(id);
    if cfg!(windows) && is_windows_device(&stem) {
        return Err(LogError::InvalidId(format!("{id:?} is a device name on Windows, so it cannot name a session file there")));
    }
    let name = stem + SUFFIX;
    if name.len() > MAX_FILE_NAME {
        return Err(LogError::InvalidId(format!(
            "{id:?} is too long: its file name would be {} bytes (at most {MAX_FILE_NAME})",
            name.len()
        )));
    }
    Ok(name)
}

/// The id of a directory entry, if it is a session file we could have written.
pub(super) fn id_of_file_name(name: &str) -> Option<String> {
    let stem = name.strip_suffix(SUFFIX)?;
    decode(stem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_bytes_are_kept_and_the_rest_escaped() {
        assert_eq!(encode("abc-XYZ_09"), "abc-XYZ_09");
        assert_eq!(encode("a/b"), "a~2Fb");
        assert_eq!(encode(".."), "~2E~2E");
        assert_eq!(encode("."), "~2E");
        assert_eq!(encode("~"), "~7E");
        assert_eq!(encode("\u{1}\n"), "~01~0A");
        assert_eq!(encode("é"), "~C3~A9");
    }

    #[test]
    fn decoding_reverses_encoding() {
        for id in ["a/b", "..", ".", "~x~", "é/ü\u{7f}", "white space", "a.jsonl", "-"] {
            let name = file_name(id).unwrap();
            assert!(!name.contains('/') && !name.starts_with('.'), "{name}");
            assert_eq!(id_of_file_name(&name).as_deref(), Some(id));
        }
    }

    #[test]
    fn non_canonical_or_foreign_names_do_not_decode() {
        for stem in ["~41", "~2e", "~2", "~", "a~ZZ", "a.b", "", "~00", "~C3", ".hidden", "a~2"] {
            assert_eq!(decode(stem), None, "{stem}");
        }
        assert_eq!(id_of_file_name("abc.json"), None);
        assert_eq!(id_of_file_name("abc.jsonl.corrupt"), None);
    }

    #[test]
    fn long_ids_are_refused() {
        let max = MAX_FILE_NAME - SUFFIX.len();
        assert!(file_name(&"x".repeat(max)).is_ok());
        assert!(matches!(file_name(&"x".repeat(max + 1)), Err(LogError::InvalidId(_))));
        // Escaping counts: 2-byte characters take 6 bytes each.
        assert!(matches!(file_name(&"é".repeat(max / 6 + 1)), Err(LogError::InvalidId(_))));
    }

    #[test]
    fn windows_device_names_are_recognised_in_any_case() {
        for stem in ["CON", "nul", "Aux", "prn", "COM1", "lpt9"] {
            assert!(is_windows_device(stem), "{stem}");
        }
        for stem in ["CONS", "NU", "COM0", "COM10", "LPT", "~4EUL", "console"] {
            assert!(!is_windows_device(stem), "{stem}");
        }
        // Refused only where the name would be a device.
        assert_eq!(file_name("nul").is_err(), cfg!(windows));
        assert_eq!(file_name("Com3").is_err(), cfg!(windows));
        assert!(file_name("null").is_ok());
    }
}
