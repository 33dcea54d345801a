//! The waterfall cursor (reference 6.2–6.3): one per dispatch, over a snapshot of listeners.
//!
//! Each `next()` pulls the next remaining listener; once none remain it yields the innermost
//! default, every time it is asked (a last listener calling `next()` twice runs the default
//! twice). The listener list is copied when the dispatch starts, so registrations made during
//! a dispatch affect only later dispatches.

/// What one `next()` call should run.
#[derive(Debug, PartialEq, Eq)]
pub enum Pull<'a, T> {
    Listener(&'a T),
    Default,
}

/// A per-dispatch cursor over a snapshot of listeners.
#[derive(Debug, Clone)]
pub struct Cursor<T> {
    listeners: Vec<T>,
    next: usize,
}

impl<T> Cursor<T> {
    pub fn new(listeners: Vec<T>) -> Self {
        Cursor { listeners, next: 0 }
    }

    /// Advances the cursor.
    pub fn pull(&mut self) -> Pull<'_, T> {
        match self.listeners.get(self.next) {
            Some(listener) => {
                self.next += 1;
                Pull::Listener(listener)
            }
            None => Pull::Default,
        }
    }

    /// Listeners not yet pulled.
    pub fn remaining(&self) -> usize {
        self.listeners.len() - self.next
    }

    /// Every listener of the snapshot, pulled or not (the binding shows them to Python's
    /// garbage collector).
    pub fn listeners(&self) -> &[T] {
        &self.listeners
    }

    /// Takes the listeners out, leaving a cursor with none remaining.
    pub fn take_listeners(&mut self) -> Vec<T> {
        self.next = 0;
        std::mem::take(&mut self.listeners)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulls_in_order_then_the_default_forever() {
        let mut c = Cursor::new(vec!["a", "b"]);
        assert_eq!(c.pull(), Pull::Listener(&"a"));
        assert_eq!(c.remaining(), 1);
        assert_eq!(c.pull(), Pull::Listener(&"b"));
        assert_eq!(c.pull(), Pull::Default);
        assert_eq!(c.pull(), Pull::Default);
    }

    #[test]
    fn taking_the_listeners_leaves_only_the_default() {
        let mut c = Cursor::new(vec!["a", "b"]);
        assert_eq!(c.pull(), Pull::Listener(&"a"));
        assert_eq!(c.listeners(), &["a", "b"]);
        assert_eq!(c.take_listeners(), vec!["a", "b"]);
        assert_eq!(c.remaining(), 0);
        assert_eq!(c.pull(), Pull::Default);
    }
}
