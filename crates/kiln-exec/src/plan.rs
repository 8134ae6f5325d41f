//! Input planning: which file goes where in `/mnt/data`.
//!
//! Pure rules, no IO: de-duplication (identical refs collapse; for `user`
//! refs the last one per name wins), the destination-collision check (the
//! same path twice, or a file that would be the parent directory of
//! another), and the destination cap.

use std::collections::{HashMap, HashSet};

use crate::types::{ExecError, InputFile};

/// Most inputs one execution accepts.
pub const MAX_INPUT_FILES: usize = 256;

/// Reduce `files` to the list actually staged, or explain why it cannot be.
pub fn plan_inputs(files: Vec<InputFile>) -> Result<Vec<InputFile>, ExecError> {
    // 1. identical by-reference entries collapse; for kind=user the last ref
    //    for a name wins (LibreChat re-sends newer outputs under the same name).
    let mut seen_refs = HashSet::new();
    let deduped: Vec<InputFile> = files
        .into_iter()
        .filter(|f| match f {
            InputFile::Ref(r) => {
                seen_refs.insert((r.storage_session_id.clone(), r.id.clone(), r.name.clone()))
            }
            InputFile::Inline { .. } => true,
        })
        .collect();
    let mut last_user_ref_for_name: HashMap<String, usize> = HashMap::new();
    for (i, f) in deduped.iter().enumerate() {
        if let InputFile::Ref(r) = f
            && r.is_user_scoped()
        {
            last_user_ref_for_name.insert(r.name.as_str().to_owned(), i);
        }
    }
    let kept: Vec<InputFile> = deduped
        .into_iter()
        .enumerate()
        .filter(|(i, f)| match f {
            InputFile::Ref(r) if r.is_user_scoped() => {
                last_user_ref_for_name.get(r.name.as_str()) == Some(i)
            }
            _ => true,
        })
        .map(|(_, f)| f)
        .collect();

    if kept.len() > MAX_INPUT_FILES {
        return Err(ExecError::BadRequest(format!(
            "too many input files: at most {MAX_INPUT_FILES} destinations are allowed"
        )));
    }

    // 2. remaining destination collisions are the caller's error.
    let mut names: HashSet<&str> = HashSet::new();
    for f in &kept {
        let name = name_of(f);
        if !names.insert(name) {
            return Err(ExecError::BadRequest(format!(
                "duplicate input destination: {name}"
            )));
        }
    }
    for f in &kept {
        let p = match f {
            InputFile::Ref(r) => &r.name,
            InputFile::Inline { name, .. } => name,
        };
        if let Some(parent) = p.ancestors().find(|a| names.contains(a)) {
            return Err(ExecError::BadRequest(format!(
                "input destination conflict: {parent} is both a file and a directory"
            )));
        }
    }
    Ok(kept)
}

pub(crate) fn name_of(f: &InputFile) -> &str {
    match f {
        InputFile::Ref(r) => r.name.as_str(),
        InputFile::Inline { name, .. } => name.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use kiln_core::{Kind, Nanoid, RelPath};

    use super::*;
    use crate::types::InputRef;

    fn user_ref(sid: &Nanoid, id: &Nanoid, name: &str) -> InputFile {
        InputFile::Ref(InputRef {
            id: id.clone(),
            storage_session_id: sid.clone(),
            name: RelPath::parse(name).unwrap(),
            kind: Some(Kind::User),
            resource_id: None,
            version: None,
            entity_id: None,
        })
    }

    fn agent_ref(name: &str) -> InputFile {
        InputFile::Ref(InputRef {
            id: Nanoid::random(),
            storage_session_id: Nanoid::random(),
            name: RelPath::parse(name).unwrap(),
            kind: Some(Kind::Agent),
            resource_id: Some("agent_x".into()),
            version: None,
            entity_id: None,
        })
    }

    #[test]
    fn identical_refs_collapse() {
        let (s, i) = (Nanoid::random(), Nanoid::random());
        let plan = plan_inputs(vec![user_ref(&s, &i, "a.csv"), user_ref(&s, &i, "a.csv")]).unwrap();
        assert_eq!(plan.len(), 1);
    }

    #[test]
    fn last_user_ref_per_name_wins() {
        let s = Nanoid::random();
        let (old, new) = (Nanoid::random(), Nanoid::random());
        let plan = plan_inputs(vec![
            user_ref(&s, &old, "a.csv"),
            user_ref(&s, &new, "a.csv"),
        ])
        .unwrap();
        assert_eq!(plan.len(), 1);
        match &plan[0] {
            InputFile::Ref(r) => assert_eq!(r.id, new),
            InputFile::Inline { .. } => panic!("expected a ref"),
        }
    }

    #[test]
    fn same_destination_from_other_kinds_is_rejected() {
        let err = plan_inputs(vec![agent_ref("a.csv"), agent_ref("a.csv")]).unwrap_err();
        assert!(matches!(err, ExecError::BadRequest(m) if m.contains("duplicate")));
    }

    #[test]
    fn file_that_is_parent_of_another_is_rejected() {
        let err = plan_inputs(vec![agent_ref("data"), agent_ref("data/x.csv")]).unwrap_err();
        assert!(matches!(err, ExecError::BadRequest(m) if m.contains("conflict")));
    }

    #[test]
    fn too_many_destinations_is_rejected() {
        let files = (0..=MAX_INPUT_FILES)
            .map(|i| agent_ref(&format!("f{i}.txt")))
            .collect();
        assert!(plan_inputs(files).is_err());
    }
}
