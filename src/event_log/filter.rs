//! Event-type filters: exact types and glob patterns, the same language in the API
//! (`log.events(types=...)`, `log.tail(types=...)`) and the CLI (`--type`).
//!
//! A type containing `*` or `?` is a pattern: `*` matches any run of characters (slashes
//! included, so `"assistant/*"` matches `"assistant/message"`), `?` exactly one character.
//! Every other character, `[` included, matches itself.

use std::collections::HashSet;

/// Which event types to keep.
#[derive(Debug, Clone, Default)]
pub struct TypeFilter {
    exact: HashSet<String>,
    patterns: Vec<String>,
}

/// Whether `text` is a pattern rather than one exact type.
pub fn is_pattern(text: &str) -> bool {
    text.contains(['*', '?'])
}

impl TypeFilter {
    /// A filter keeping the events whose type is one of `types` or matches one of them.
    pub fn new<I: IntoIterator<Item = String>>(types: I) -> Self {
        let mut filter = TypeFilter::default();
        for t in types {
            if is_pattern(&t) {
                filter.patterns.push(t);
            } else {
                filter.exact.insert(t);
            }
        }
        filter
    }

    pub fn matches(&self, kind: &str) -> bool {
        self.exact.contains(kind) || self.patterns.iter().any(|p| glob(p, kind))
    }

    /// The exact types and patterns, for passing the filter on.
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.exact.iter().chain(&self.patterns).map(String::as_str)
    }
}

/// `*`/`?` matching by characters, with one backtrack point (the last `*`): linear for the
/// patterns people write, never exponential.
fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("assistant/*", "assistant/message"));
        assert!(glob("assistant/*", "assistant/"));
        assert!(!glob("assistant/*", "assistant"));
        assert!(glob("*", ""));
        assert!(glob("*/end", "turn/end"));
        assert!(glob("*/*", "agent/inbox/spliced"));
        assert!(glob("t?rn/*", "turn/start"));
        assert!(!glob("t?rn/*", "tarn"));
        assert!(glob("a*b*c", "aXbYbZc"));
        assert!(!glob("a*b*c", "aXbYbZ"));
        assert!(glob("plugin/[x]", "plugin/[x]"));
        assert!(glob("é?", "éü"));
    }

    #[test]
    fn exact_types_and_patterns_together() {
        let f = TypeFilter::new(["turn/*".to_string(), "user/message".to_string()]);
        assert!(f.matches("turn/start"));
        assert!(f.matches("user/message"));
        assert!(!f.matches("user/messages"));
        assert!(!f.matches("step/start"));
        let mut entries: Vec<_> = f.entries().collect();
        entries.sort_unstable();
        assert_eq!(entries, ["turn/*", "user/message"]);
    }
}
