//! The output walker: after a run, decide which files in the workspace are
//! reported, and how (spec §5.6).
//!
//! Runs on the host as root over a directory untrusted code wrote to, but
//! only after every process of the jail is dead, so nothing changes under
//! it. Every look at the workspace goes through [`Workspace`], which never
//! follows a symlink (not even one planted as an intermediate directory):
//! entries are classified without following them, files are opened only
//! when regular, FIFOs, sockets and devices are ignored, and a by-reference
//! input counts as present only when it is a regular file reached without
//! links (so `deleted_files` says nothing about paths outside).

use std::collections::{HashMap, HashSet};
use std::io::{self, Read};

use kiln_core::Nanoid;
use kiln_core::allow::{DIRKEEP, is_reportable};
use kiln_core::path::{MAX_DEPTH, MAX_PATH_LEN};
use sha2::{Digest, Sha256};

use crate::types::Truncation;
use crate::workspace::{EntryKind, Workspace};

/// PTC plumbing that is never an output.
const PTC_HISTORY: &str = "_ptc_history.json";
/// At most this many skipped paths are listed in `artifact_truncation`.
const MAX_SKIPPED_LISTED: usize = 20;

/// What the walker knows about a staged input.
#[derive(Debug, Clone)]
pub struct StagedInput {
    /// `(id, storage_session_id)` for by-reference inputs; `None` for inline.
    pub origin: Option<(Nanoid, Nanoid)>,
    pub sha256: String,
    pub size: u64,
    pub read_only: bool,
    pub entity_id: Option<String>,
}

/// Caps applied by the walker.
#[derive(Debug, Clone)]
pub struct WalkLimits {
    pub max_output_files: usize,
    pub max_file_bytes: u64,
    /// Most bytes (logical sizes: a sparse file counts in full, as it will
    /// be stored) all of one run's new outputs may total; outputs past it
    /// are skipped with the reason `storage`.
    pub max_total_bytes: u64,
}

/// A file to store as a new output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub name: String,
    pub modified_from: Option<(Nanoid, Nanoid)>,
    /// Its size when walked.
    pub size: u64,
}

/// An unchanged (or read-only) input echoed with its original ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inherited {
    pub name: String,
    pub id: Nanoid,
    pub storage_session_id: Nanoid,
    pub entity_id: Option<String>,
}

#[derive(Debug, Default)]
pub struct WalkOutcome {
    pub generated: Vec<Generated>,
    pub inherited: Vec<Inherited>,
    pub deleted: Vec<String>,
    pub truncation: Option<Truncation>,
    /// [`walk_keeping`] only: files that are not reported (by name: a
    /// `.pkl`, a file without an extension) but new or changed, to be kept
    /// silently in a workspace session.
    pub kept: Vec<Generated>,
    /// Files that would have been kept but were over a cap (never
    /// reported: they were never outputs).
    pub kept_skipped: Vec<String>,
}

/// Walk the workspace `ws` (the host directory that was `/mnt/data`).
///
/// `inputs` maps relative names to what was staged there; `entry` is the
/// entry file name and the hash of the code written to it.
pub fn walk(
    ws: &Workspace,
    inputs: &HashMap<String, StagedInput>,
    entry: (&str, &str),
    limits: &WalkLimits,
) -> io::Result<WalkOutcome> {
    walk_inner(ws, inputs, entry, limits, false)
}

/// [`walk`] for a workspace that persists (a workspace session): besides
/// the outputs, every other new or changed regular file the walk reaches is
/// listed in [`WalkOutcome::kept`], under the same per-file size cap, as
/// many again as the output count cap, and the bytes the outputs left of
/// the run's budget.
pub fn walk_keeping(
    ws: &Workspace,
    inputs: &HashMap<String, StagedInput>,
    entry: (&str, &str),
    limits: &WalkLimits,
) -> io::Result<WalkOutcome> {
    walk_inner(ws, inputs, entry, limits, true)
}

fn walk_inner(
    ws: &Workspace,
    inputs: &HashMap<String, StagedInput>,
    entry: (&str, &str),
    limits: &WalkLimits,
    keep_unreported: bool,
) -> io::Result<WalkOutcome> {
    let input_dirs: HashSet<String> = inputs
        .keys()
        .flat_map(|n| {
            n.match_indices('/')
                .map(|(i, _)| n[..i].to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut w = Walker {
        ws,
        inputs,
        input_dirs: &input_dirs,
        entry,
        limits,
        keep_unreported,
        candidates_generated: Vec::new(),
        candidates_inherited: Vec::new(),
        candidates_kept: Vec::new(),
        kept_skipped: Vec::new(),
        trunc: Truncation::default(),
    };
    w.dir("", 0)?;

    let Walker {
        candidates_generated: mut generated,
        candidates_inherited: mut inherited,
        candidates_kept,
        mut kept_skipped,
        mut trunc,
        ..
    } = w;

    // caps: generated first, inherited echoes fill the remaining slots
    let max = limits.max_output_files;
    if generated.len() > max {
        for g in generated.drain(max..) {
            skip(&mut trunc, g.name, |t| &mut t.max_files);
        }
    }
    // the run's byte budget, in walk order (small files first would favour
    // many small outputs over the one a program meant; keep its order)
    let mut total = 0u64;
    let mut kept = Vec::with_capacity(generated.len());
    for g in generated {
        if total.saturating_add(g.size) > limits.max_total_bytes {
            skip(&mut trunc, g.name, |t| &mut t.storage);
        } else {
            total += g.size;
            kept.push(g);
        }
    }
    let generated = kept;
    // silently kept files: the same count again, what is left of the bytes
    let mut kept = Vec::new();
    for k in candidates_kept {
        if kept.len() >= max || total.saturating_add(k.size) > limits.max_total_bytes {
            kept_skipped.push(k.name);
        } else {
            total += k.size;
            kept.push(k);
        }
    }
    let room = max - generated.len();
    if inherited.len() > room {
        for i in inherited.drain(room..) {
            skip(&mut trunc, i.name, |t| &mut t.max_files);
        }
    }

    let truncated = trunc.skipped_count > 0;
    // deleted_files: by-reference inputs that are gone (only for a full scan)
    let mut deleted = Vec::new();
    if !truncated {
        for (name, input) in inputs {
            if input.origin.is_some() && !ws.is_regular(name) {
                deleted.push(name.clone());
            }
        }
        deleted.sort();
    }

    Ok(WalkOutcome {
        generated,
        inherited,
        deleted,
        truncation: truncated.then_some(trunc),
        kept,
        kept_skipped,
    })
}

struct Walker<'a> {
    ws: &'a Workspace,
    inputs: &'a HashMap<String, StagedInput>,
    input_dirs: &'a HashSet<String>,
    entry: (&'a str, &'a str),
    limits: &'a WalkLimits,
    keep_unreported: bool,
    candidates_generated: Vec<Generated>,
    candidates_inherited: Vec<Inherited>,
    candidates_kept: Vec<Generated>,
    kept_skipped: Vec<String>,
    trunc: Truncation,
}

impl Walker<'_> {
    /// Walk the directory whose relative name is `rel` ("" for the root)
    /// and which sits `depth` directories below the root.
    fn dir(&mut self, rel: &str, depth: usize) -> io::Result<()> {
        let mut entries = match self.ws.read_dir(rel) {
            Ok(Some(entries)) => entries,
            Ok(None) | Err(_) if depth > 0 => {
                skip(&mut self.trunc, rel.to_owned(), |t| &mut t.unreadable);
                return Ok(());
            }
            Ok(None) => return Err(io::Error::other("the workspace is not a directory")),
            Err(e) => return Err(e),
        };
        entries.sort_by(|a, b| a.name.cmp(&b.name));

        if entries.is_empty() && depth > 0 {
            // preserve the empty directory with a marker
            let marker = format!("{rel}/{DIRKEEP}");
            if marker.len() <= MAX_PATH_LEN && self.ws.create_file(&marker).is_ok() {
                self.file(&marker)?;
            }
            return Ok(());
        }

        for e in entries {
            let Some(name) = e.name.to_str().map(str::to_owned) else {
                // not UTF-8: cannot be named in the API
                let lossy = format!("{rel}/{}", e.name.to_string_lossy());
                skip(&mut self.trunc, lossy, |t| &mut t.unreadable);
                continue;
            };
            let child_rel = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            match e.kind {
                EntryKind::Dir => {
                    if name.starts_with('.') && !self.input_dirs.contains(&child_rel) {
                        continue;
                    }
                    if depth + 1 > MAX_DEPTH {
                        skip(&mut self.trunc, child_rel, |t| &mut t.depth);
                        continue;
                    }
                    self.dir(&child_rel, depth + 1)?;
                }
                EntryKind::File => self.file(&child_rel)?,
                // links, FIFOs, sockets and devices are never outputs
                EntryKind::Symlink | EntryKind::Other => {}
            }
        }
        Ok(())
    }

    fn file(&mut self, rel: &str) -> io::Result<()> {
        let base = rel.rsplit('/').next().unwrap_or(rel);
        if base == PTC_HISTORY && !rel.contains('/') {
            return Ok(());
        }
        if !is_reportable(base) {
            return if self.keep_unreported {
                self.keep(rel)
            } else {
                Ok(())
            };
        }
        if rel.len() > MAX_PATH_LEN {
            skip(&mut self.trunc, rel.to_owned(), |t| &mut t.path);
            return Ok(());
        }
        let Some((_, size)) = self.ws.open_regular(rel)? else {
            return Ok(());
        };

        if let Some(input) = self.inputs.get(rel) {
            let unchanged = self.unchanged(rel, size, input)?;
            match (&input.origin, unchanged) {
                (Some((id, sid)), true) => {
                    self.candidates_inherited.push(Inherited {
                        name: rel.to_owned(),
                        id: id.clone(),
                        storage_session_id: sid.clone(),
                        entity_id: input.entity_id.clone(),
                    });
                    return Ok(());
                }
                (Some(origin), false) => {
                    if size > self.limits.max_file_bytes {
                        skip(&mut self.trunc, rel.to_owned(), |t| &mut t.size);
                        return Ok(());
                    }
                    self.candidates_generated.push(Generated {
                        name: rel.to_owned(),
                        modified_from: Some(origin.clone()),
                        size,
                    });
                    return Ok(());
                }
                // inline inputs are re-emitted with fresh ids
                (None, _) => {}
            }
        } else if rel == self.entry.0 && hash_file(self.ws, rel)?.as_deref() == Some(self.entry.1) {
            return Ok(());
        }

        if size > self.limits.max_file_bytes {
            skip(&mut self.trunc, rel.to_owned(), |t| &mut t.size);
            return Ok(());
        }
        self.candidates_generated.push(Generated {
            name: rel.to_owned(),
            modified_from: None,
            size,
        });
        Ok(())
    }
}

impl Walker<'_> {
    /// Whether the staged input `input` at `rel` (now `size` bytes) is as it
    /// was staged: a read-only input always is; else same size and hash.
    fn unchanged(&self, rel: &str, size: u64, input: &StagedInput) -> io::Result<bool> {
        Ok(input.read_only
            || (size == input.size && hash_file(self.ws, rel)?.as_deref() == Some(&input.sha256)))
    }

    /// A file that is not an output: kept if new or changed.
    fn keep(&mut self, rel: &str) -> io::Result<()> {
        if rel.len() > MAX_PATH_LEN || rel == self.entry.0 {
            return Ok(());
        }
        let Some((_, size)) = self.ws.open_regular(rel)? else {
            return Ok(());
        };
        let modified_from = match self.inputs.get(rel) {
            Some(input) => {
                let unchanged = self.unchanged(rel, size, input)?;
                match (&input.origin, unchanged) {
                    // still stored as it was
                    (Some(_), true) => return Ok(()),
                    (origin, _) => origin.clone(),
                }
            }
            None => None,
        };
        if size > self.limits.max_file_bytes {
            self.kept_skipped.push(rel.to_owned());
            return Ok(());
        }
        self.candidates_kept.push(Generated {
            name: rel.to_owned(),
            modified_from,
            size,
        });
        Ok(())
    }
}

/// Records a skipped output under `reason`.
pub(crate) fn skip(
    t: &mut Truncation,
    name: String,
    reason: impl FnOnce(&mut Truncation) -> &mut u32,
) {
    *reason(t) += 1;
    t.skipped_count += 1;
    if t.skipped.len() < MAX_SKIPPED_LISTED {
        t.skipped.push(name);
    }
}

/// SHA-256 of the regular file `rel` of `ws`, hex encoded; `None` unless a
/// regular file.
pub fn hash_file(ws: &Workspace, rel: &str) -> io::Result<Option<String>> {
    let Some((mut f, _)) = ws.open_regular(rel)? else {
        return Ok(None);
    };
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(Some(hex::encode(h.finalize())))
}

/// SHA-256 of bytes, hex encoded.
pub fn hash_bytes(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    use super::*;

    fn limits() -> WalkLimits {
        WalkLimits {
            max_output_files: 50,
            max_file_bytes: 1024,
            max_total_bytes: 4096,
        }
    }

    fn input(content: &[u8], read_only: bool) -> StagedInput {
        StagedInput {
            origin: Some((Nanoid::random(), Nanoid::random())),
            sha256: hash_bytes(content),
            size: content.len() as u64,
            read_only,
            entity_id: None,
        }
    }

    fn names(g: &[Generated]) -> Vec<&str> {
        g.iter().map(|g| g.name.as_str()).collect()
    }

    fn run(dir: &Path, inputs: &HashMap<String, StagedInput>) -> WalkOutcome {
        let ws = Workspace::open(dir, (0, 0)).unwrap();
        walk(
            &ws,
            inputs,
            ("main.py", &hash_bytes(b"print(1)")),
            &limits(),
        )
        .unwrap()
    }

    #[test]
    fn reports_new_allowed_files_recursively_and_ignores_others() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("out/sub")).unwrap();
        fs::write(d.path().join("a.csv"), "x").unwrap();
        fs::write(d.path().join("out/sub/p.png"), "x").unwrap();
        fs::write(d.path().join("model.pkl"), "x").unwrap();
        fs::write(d.path().join("README"), "x").unwrap();
        let w = run(d.path(), &HashMap::new());
        assert_eq!(names(&w.generated), ["a.csv", "out/sub/p.png"]);
        assert!(w.truncation.is_none());
    }

    #[test]
    fn a_persisting_workspace_keeps_new_and_changed_files_that_are_not_outputs() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("a.csv"), "x").unwrap();
        fs::write(d.path().join("model.pkl"), "new").unwrap();
        fs::write(d.path().join("README"), "x").unwrap();
        fs::write(d.path().join("same.npy"), "old").unwrap();
        fs::write(d.path().join("changed.db"), "new!").unwrap();
        fs::write(d.path().join("big.bin"), vec![0u8; 2048]).unwrap();
        let same = input(b"old", false);
        let changed = input(b"old", false);
        let origin = changed.origin.clone();
        let inputs = HashMap::from([
            ("same.npy".to_owned(), same),
            ("changed.db".to_owned(), changed),
        ]);
        let ws = Workspace::open(d.path(), (0, 0)).unwrap();
        let entry = ("main.py", hash_bytes(b"print(1)"));
        let w = walk_keeping(&ws, &inputs, (entry.0, &entry.1), &limits()).unwrap();
        assert_eq!(names(&w.generated), ["a.csv"], "outputs as before");
        assert_eq!(names(&w.kept), ["README", "changed.db", "model.pkl"]);
        assert_eq!(w.kept[1].modified_from, origin);
        assert_eq!(w.kept_skipped, ["big.bin"], "over the per-file cap");
        assert!(w.truncation.is_none(), "kept files are not outputs");
        // a plain walk keeps nothing
        assert!(run(d.path(), &inputs).kept.is_empty());
    }

    #[test]
    fn symlinks_fifos_and_hidden_dirs_are_never_reported() {
        let d = tempfile::tempdir().unwrap();
        symlink("/etc/passwd", d.path().join("passwd.txt")).unwrap();
        symlink("/etc", d.path().join("etcdir")).unwrap();
        nix_mkfifo(&d.path().join("pipe.txt"));
        fs::create_dir_all(d.path().join(".cache")).unwrap();
        fs::write(d.path().join(".cache/x.json"), "{}").unwrap();
        let w = run(d.path(), &HashMap::new());
        assert!(w.generated.is_empty(), "{:?}", w.generated);
    }

    #[test]
    fn hidden_dir_holding_an_input_is_walked() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join(".cfg")).unwrap();
        fs::write(d.path().join(".cfg/a.json"), "{}").unwrap();
        fs::write(d.path().join(".cfg/new.json"), "{}").unwrap();
        let mut inputs = HashMap::new();
        inputs.insert(".cfg/a.json".to_owned(), input(b"{}", false));
        let w = run(d.path(), &inputs);
        assert_eq!(names(&w.generated), [".cfg/new.json"]);
        assert_eq!(w.inherited.len(), 1);
    }

    #[test]
    fn unchanged_input_is_inherited_with_original_ids() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("data.csv"), "a,b\n").unwrap();
        let inp = input(b"a,b\n", false);
        let (id, sid) = inp.origin.clone().unwrap();
        let inputs = HashMap::from([("data.csv".to_owned(), inp)]);
        let w = run(d.path(), &inputs);
        assert!(w.generated.is_empty());
        assert_eq!(
            w.inherited,
            [Inherited {
                name: "data.csv".into(),
                id,
                storage_session_id: sid,
                entity_id: None
            }]
        );
    }

    #[test]
    fn changed_input_is_a_new_output_with_modified_from_even_with_same_size() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("data.csv"), "a,c\n").unwrap();
        let inp = input(b"a,b\n", false);
        let origin = inp.origin.clone();
        let inputs = HashMap::from([("data.csv".to_owned(), inp)]);
        let w = run(d.path(), &inputs);
        assert_eq!(
            w.generated,
            [Generated {
                name: "data.csv".into(),
                modified_from: origin,
                size: 4,
            }]
        );
    }

    #[test]
    fn read_only_input_is_inherited_even_when_changed() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("skill.md"), "changed").unwrap();
        let inputs = HashMap::from([("skill.md".to_owned(), input(b"orig", true))]);
        let w = run(d.path(), &inputs);
        assert!(w.generated.is_empty());
        assert_eq!(w.inherited.len(), 1);
    }

    #[test]
    fn unchanged_entry_file_is_not_reported_but_changed_one_is() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("main.py"), "print(1)").unwrap();
        assert!(run(d.path(), &HashMap::new()).generated.is_empty());
        fs::write(d.path().join("main.py"), "print(2)").unwrap();
        assert_eq!(
            names(&run(d.path(), &HashMap::new()).generated),
            ["main.py"]
        );
    }

    #[test]
    fn empty_directory_gets_a_dirkeep_marker() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("empty/inner")).unwrap();
        let w = run(d.path(), &HashMap::new());
        assert_eq!(names(&w.generated), ["empty/inner/.dirkeep"]);
        assert!(d.path().join("empty/inner/.dirkeep").exists());
    }

    #[test]
    fn an_input_behind_a_planted_directory_link_counts_as_deleted() {
        // the program replaced the input's directory with a link to a host
        // directory holding a file of the same name: the host file must not
        // make the input look present (no existence oracle for host paths)
        let d = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        fs::write(host.path().join("data.csv"), "a,b\n").unwrap();
        symlink(host.path(), d.path().join("in")).unwrap();
        let inputs = HashMap::from([("in/data.csv".to_owned(), input(b"a,b\n", false))]);
        let w = run(d.path(), &inputs);
        assert_eq!(w.deleted, ["in/data.csv"]);
        assert!(w.inherited.is_empty() && w.generated.is_empty());
    }

    #[test]
    fn deleted_inputs_are_listed() {
        let d = tempfile::tempdir().unwrap();
        let inputs = HashMap::from([("gone.csv".to_owned(), input(b"x", false))]);
        let w = run(d.path(), &inputs);
        assert_eq!(w.deleted, ["gone.csv"]);
    }

    #[test]
    fn oversize_and_too_deep_files_are_truncated_with_reasons() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("big.txt"), vec![b'x'; 2048]).unwrap();
        let deep = (0..11)
            .map(|i| format!("d{i}"))
            .collect::<Vec<_>>()
            .join("/");
        fs::create_dir_all(d.path().join(&deep)).unwrap();
        fs::write(d.path().join(&deep).join("f.txt"), "x").unwrap();
        let w = run(d.path(), &HashMap::new());
        let t = w.truncation.unwrap();
        assert_eq!(t.size, 1);
        assert_eq!(t.depth, 1);
        assert_eq!(t.skipped_count, 2);
        assert!(t.skipped.contains(&"big.txt".to_owned()));
    }

    #[test]
    fn outputs_past_the_runs_byte_total_are_skipped_for_storage() {
        let d = tempfile::tempdir().unwrap();
        // 1000 bytes each, logical: sparse files count in full
        for i in 0..6 {
            let f = fs::File::create(d.path().join(format!("s{i}.csv"))).unwrap();
            f.set_len(1000).unwrap();
        }
        let w = run(d.path(), &HashMap::new());
        // the limit is 4096 bytes: four fit
        assert_eq!(w.generated.len(), 4);
        assert_eq!(w.generated.iter().map(|g| g.size).sum::<u64>(), 4000);
        let t = w.truncation.unwrap();
        assert_eq!((t.storage, t.skipped_count), (2, 2));
        assert!(
            w.deleted.is_empty(),
            "a truncated walk reports no deletions"
        );
    }

    #[test]
    fn output_cap_keeps_fifty_and_counts_the_rest() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..60 {
            fs::write(d.path().join(format!("f{i:02}.txt")), "x").unwrap();
        }
        let w = run(d.path(), &HashMap::new());
        assert_eq!(w.generated.len(), 50);
        let t = w.truncation.unwrap();
        assert_eq!(t.max_files, 10);
        assert_eq!(t.skipped.len(), 10);
        assert!(w.deleted.is_empty());
    }

    #[test]
    fn ptc_history_is_never_reported() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("_ptc_history.json"), "{}").unwrap();
        assert!(run(d.path(), &HashMap::new()).generated.is_empty());
    }

    fn nix_mkfifo(p: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap();
        assert!(status.success());
    }
}
