//! The one-time warning that lm-model runs unoptimised.
//!
//! Cargo applies a workspace's per-package `opt-level` only inside that
//! workspace: a program that depends on lm-model builds it at `opt-level = 0`
//! in its dev profile, and a decoder then runs about 100 times slower than in
//! `--release`. Code cannot see the opt-level; it can see debug assertions,
//! which the dev profile turns on with opt-level 0 and release turns off
//! with it. So when lm-model was compiled with debug assertions, the first
//! decoder built logs a warning (through the `log` facade: the application's
//! logger shows it, if it installs one) with the lines that fix it.

use std::sync::Once;

/// The warning, with the profile lines to copy into the program's manifest.
pub(crate) const UNOPTIMISED_WARNING: &str = "lm-model was built with debug assertions, \
the dev profile's default, which usually means unoptimised: a decoder runs about 100x \
slower than in --release. Add to your Cargo.toml: [profile.dev.package.lm-model] \
opt-level = 3, debug-assertions = false (and opt-level = 3 for lm-core, lm-decode, \
lm-tokenize, ndarray, matrixmultiply, half, tokenizers; see the lm-model crate docs)";

/// Completed once the warning was logged.
static WARNED: Once = Once::new();

/// Logs [`UNOPTIMISED_WARNING`] once per process when lm-model was compiled
/// with debug assertions.
pub(crate) fn warn_once_if_unoptimised() {
    warn_once(&WARNED, cfg!(debug_assertions));
}

fn warn_once(warned: &Once, debug_assertions: bool) {
    if debug_assertions {
        warned.call_once(|| log::warn!("{UNOPTIMISED_WARNING}"));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    thread_local! {
        /// The warnings logged on this thread (tests run on threads of their own).
        static LOGGED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    struct ThreadLogger;

    impl log::Log for ThreadLogger {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            LOGGED.with(|l| {
                l.borrow_mut()
                    .push(format!("{} {}", record.level(), record.args()))
            });
        }
        fn flush(&self) {}
    }

    fn logged_by(run: impl FnOnce()) -> Vec<String> {
        // Another test of this binary may have installed it first.
        let _ = log::set_logger(&ThreadLogger);
        log::set_max_level(log::LevelFilter::Warn);
        LOGGED.with(|l| l.borrow_mut().clear());
        run();
        LOGGED.with(|l| l.take())
    }

    #[test]
    fn an_unoptimised_build_warns_once_with_the_lines_to_copy() {
        let warned = Once::new();
        let logged = logged_by(|| {
            warn_once(&warned, true);
            warn_once(&warned, true);
        });
        assert_eq!(logged, [format!("WARN {UNOPTIMISED_WARNING}")]);
        assert!(UNOPTIMISED_WARNING.contains("[profile.dev.package.lm-model]"));
        assert!(UNOPTIMISED_WARNING.contains("opt-level = 3"));
    }

    #[test]
    fn building_a_decoder_warns_when_built_with_debug_assertions() {
        let _decoder = crate::Toy::decoder();
        assert_eq!(WARNED.is_completed(), cfg!(debug_assertions));
    }

    #[test]
    fn an_optimised_build_says_nothing() {
        let warned = Once::new();
        assert_eq!(
            logged_by(|| warn_once(&warned, false)),
            Vec::<String>::new()
        );
    }
}
