//! Ctrl-C in `generate` and `chat`: while text is being generated, the first SIGINT cancels the
//! generation at its next step boundary (the text so far is kept, `--save` still saves, `chat`
//! goes back to reading turns); a second one, or one while nothing is being generated, ends the
//! process as an unhandled SIGINT does.

use htpkv::session::Cancel;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static GENERATING: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    if GENERATING.load(Ordering::SeqCst) && !INTERRUPTED.swap(true, Ordering::SeqCst) {
        return;
    }
    // SAFETY: signal() and raise() are async-signal-safe; with the default action restored, the
    // re-raised SIGINT ends the process as if no handler had been installed.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::raise(libc::SIGINT);
    }
}

/// Installs the SIGINT handler (once) and returns the cancel handle it sets.
pub fn cancel_on_ctrl_c() -> Cancel {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let handler: extern "C" fn(libc::c_int) = on_sigint;
        // SAFETY: the handler only touches atomics and calls async-signal-safe functions; `action`
        // is a zeroed sigaction with its handler and an empty mask set, as sigaction(2) expects.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
        }
    });
    Cancel::from_static(&INTERRUPTED)
}

/// While alive, Ctrl-C cancels the generation instead of ending the process.
#[derive(Debug)]
pub struct Generating(());

impl Generating {
    /// A generation starts: a Ctrl-C from now on cancels it.
    pub fn start() -> Generating {
        INTERRUPTED.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        Generating(())
    }
}

impl Drop for Generating {
    fn drop(&mut self) {
        GENERATING.store(false, Ordering::SeqCst);
    }
}
