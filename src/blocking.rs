//! A hook around every wait the core may do on another thread.
//!
//! The core never depends on Python, but when it is embedded in Python a thread that waits on a
//! core lock while holding the GIL would deadlock against the holder, which needs the GIL to
//! finish running a Python observer. The binding installs a hook that releases the GIL for the
//! duration of the wait; without a hook the wait simply runs.

use std::sync::OnceLock;

type Hook = fn(&mut dyn FnMut());

static HOOK: OnceLock<Hook> = OnceLock::new();

/// Installs the process-wide wait hook. Only the first call has an effect.
pub fn set_hook(hook: Hook) {
    let _ = HOOK.set(hook);
}

/// Runs `f`, a wait that may block on another thread, through the installed hook.
pub fn wait<R>(f: impl FnOnce() -> R) -> R {
    let Some(hook) = HOOK.get() else {
        return f();
    };
    let mut f = Some(f);
    let mut out = None;
    hook(&mut || {
        if let Some(f) = f.take() {
            out = Some(f());
        }
    });
    match (out, f) {
        (Some(out), _) => out,
        // A hook that forgot to call the closure: run the wait here.
        (None, Some(f)) => f(),
        (None, None) => unreachable!("the wait ran but produced nothing"),
    }
}
