//! Counts, per module, what failed programs tried to import and did not
//! find (`kiln_missing_modules_total`): the measurement of what an image
//! lacks (`kiln_core::lang::missing` reads the module from stderr).

use std::collections::BTreeSet;
use std::sync::Mutex;

use kiln_core::lang::missing::missing_module;
use kiln_core::outcome::ExitStatus;

use crate::types::ExecResult;

/// Distinct module names the series keeps; later ones count as `other`.
/// Programs choose the names, so the label set must be bounded.
pub const MAX_MODULES: usize = 200;
/// The module label of names past [`MAX_MODULES`].
pub const OTHER: &str = "other";

static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Counts the module a run's program died without, if it did.
pub(crate) fn count(lang: &'static str, result: &ExecResult) {
    if result.exit == ExitStatus::Code(0) && result.status.is_none() {
        return;
    }
    let Some(m) = missing_module(&result.stderr) else {
        return;
    };
    let module = label(m.module);
    metrics::counter!("kiln_missing_modules_total", "lang" => lang,
        "ecosystem" => m.ecosystem.name(), "module" => module)
    .increment(1);
}

/// The label for `module`: itself while fewer than [`MAX_MODULES`] names
/// were seen, else [`OTHER`] for a name not seen yet.
fn label(module: &str) -> String {
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.contains(module) {
        return module.to_owned();
    }
    if seen.len() < MAX_MODULES {
        seen.insert(module.to_owned());
        return module.to_owned();
    }
    OTHER.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_label_set_is_bounded_and_known_names_keep_their_label() {
        let first = label("polars_bound_test_0");
        assert_eq!(first, "polars_bound_test_0");
        for i in 1..MAX_MODULES * 2 {
            label(&format!("polars_bound_test_{i}"));
        }
        assert_eq!(label("a_name_never_seen_before"), OTHER);
        assert_eq!(label("polars_bound_test_0"), "polars_bound_test_0");
        let seen = SEEN.lock().unwrap();
        assert_eq!(seen.len(), MAX_MODULES);
    }
}
