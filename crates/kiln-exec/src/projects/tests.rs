use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

use super::*;

fn caller(user: &str) -> Caller {
    Caller::identified("local", user)
}

fn me() -> (u32, u32) {
    let m = std::fs::metadata("/proc/self").unwrap();
    (m.uid(), m.gid())
}

fn projects(budget: u64) -> (Projects, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let p = Projects::new(ProjectsConfig {
        dir: dir.path().join("projects"),
        budget_bytes: budget,
    })
    .unwrap();
    (p, dir)
}

/// `user`'s project `name` (created) holding `rel` = `bytes`.
async fn with_file(
    projects: &Projects,
    user: &str,
    name: &str,
    rel: &str,
    bytes: &[u8],
) -> Project {
    let p = projects.open(&caller(user), name).await.unwrap();
    projects.write(&p, rel, bytes.to_vec()).await.unwrap();
    p
}

async fn absent(projects: &Projects, user: &str, name: &str) -> bool {
    projects.find(&caller(user), name).await.unwrap().is_none()
}

#[tokio::test]
async fn a_project_belongs_to_its_principal_and_name() {
    let (projects, _d) = projects(1 << 20);
    let alice = with_file(&projects, "alice", "w1", "src/main.py", b"print(1)").await;
    // the same principal and name find it again, with its file
    let again = projects
        .find(&caller("alice"), "w1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again, alice);
    assert_eq!(
        projects.read(&again, "src/main.py", 100).await.unwrap(),
        Some(b"print(1)".to_vec())
    );
    // another principal, or another name, sees nothing
    assert!(absent(&projects, "bob", "w1").await);
    assert!(absent(&projects, "alice", "w2").await);
    let bobs = projects.open(&caller("bob"), "w1").await.unwrap();
    assert_ne!(bobs.id(), alice.id());
    assert_eq!(
        projects.read(&bobs, "src/main.py", 100).await.unwrap(),
        None
    );
    // bad names are refused
    assert!(matches!(
        projects.open(&caller("alice"), "a/b").await,
        Err(ProjectError::BadName(_))
    ));
    // and deleting removes it
    assert!(projects.delete(&caller("alice"), "w1").await.unwrap());
    assert!(absent(&projects, "alice", "w1").await);
    assert!(!projects.delete(&caller("alice"), "w1").await.unwrap());
}

#[tokio::test]
async fn paths_outside_the_project_are_refused() {
    let (projects, _d) = projects(1 << 20);
    let p = projects.open(&caller("alice"), "w").await.unwrap();
    for bad in ["../x", "/etc/passwd", "a/../../x", ""] {
        assert!(
            matches!(
                projects.write(&p, bad, b"x".to_vec()).await,
                Err(ProjectError::BadPath(_))
            ),
            "{bad:?} refused"
        );
    }
    assert!(projects.list(&p, "").await.unwrap().unwrap().is_empty());
}

#[tokio::test]
async fn a_checked_out_copy_commits_back_and_links_are_copied_never_followed() {
    let (projects, d) = projects(1 << 20);
    let p = with_file(&projects, "alice", "w", "keep.txt", b"kept").await;
    let work = d.path().join("work");
    std::fs::create_dir(&work).unwrap();
    projects.check_out(&p, &work, me()).await.unwrap();
    assert_eq!(std::fs::read(work.join("keep.txt")).unwrap(), b"kept");

    // "the run": a new file, an executable, a link out of the project, a FIFO
    let secret = d.path().join("secret");
    std::fs::write(&secret, "host secret").unwrap();
    std::fs::create_dir(work.join("bin")).unwrap();
    std::fs::write(work.join("bin/tool"), "#!/bin/sh").unwrap();
    std::fs::set_permissions(
        work.join("bin/tool"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    symlink(&secret, work.join("leak")).unwrap();
    symlink(d.path(), work.join("hostdir")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        work.join("fifo"),
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    assert_eq!(
        projects.commit(&p, &work).await.unwrap(),
        4 + 9 + secret.as_os_str().len() as u64 + d.path().as_os_str().len() as u64
    );

    let tree = p.tree();
    // links come back as links (the host never read through them)
    assert_eq!(std::fs::read_link(tree.join("leak")).unwrap(), secret);
    assert_eq!(projects.read(&p, "leak", 100).await.unwrap(), None);
    assert_eq!(
        projects.read(&p, "hostdir/secret", 100).await.unwrap(),
        None
    );
    assert!(projects.list(&p, "hostdir").await.unwrap().is_none());
    // writing through a planted link directory is refused, nothing lands outside
    assert!(
        projects
            .write(&p, "hostdir/x", b"x".to_vec())
            .await
            .is_err()
    );
    assert!(!d.path().join("x").exists());
    // permission bits only (no setuid); no FIFO
    let mode = std::fs::metadata(tree.join("bin/tool")).unwrap().mode();
    assert_eq!(mode & 0o7777, 0o755);
    assert!(!tree.join("fifo").exists());
    // the old tree is gone, no leftovers
    let names: Vec<_> = std::fs::read_dir(&p.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("tree")]);
}

#[tokio::test]
async fn a_run_over_the_budget_commits_nothing() {
    let (projects, d) = projects(1000);
    let p = projects.open(&caller("alice"), "w").await.unwrap();
    projects.write(&p, "a.txt", vec![b'a'; 600]).await.unwrap();
    // a write that would exceed the budget is refused and changes nothing
    assert!(matches!(
        projects.write(&p, "b.txt", vec![b'b'; 600]).await,
        Err(ProjectError::OverBudget { budget: 1000, .. })
    ));
    // replacing a file counts the new size, not both
    projects.write(&p, "a.txt", vec![b'c'; 900]).await.unwrap();

    let work = d.path().join("work");
    std::fs::create_dir(&work).unwrap();
    projects.check_out(&p, &work, me()).await.unwrap();
    std::fs::write(work.join("a.txt"), "changed").unwrap();
    std::fs::write(work.join("big.bin"), vec![0u8; 2000]).unwrap();
    let err = projects.commit(&p, &work).await.unwrap_err();
    assert!(
        matches!(err, ProjectError::OverBudget { budget: 1000, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("discarded"));
    // the project is as it was before the run
    assert_eq!(
        projects.read(&p, "a.txt", 1000).await.unwrap(),
        Some(vec![b'c'; 900])
    );
    assert_eq!(projects.read(&p, "big.bin", 5000).await.unwrap(), None);
    assert_eq!(projects.usage(&p).await.unwrap(), (900, 1));
}

#[tokio::test]
async fn an_interrupted_commit_is_cleaned_up_on_open() {
    let (projects, _d) = projects(1 << 20);
    let p = projects.open(&caller("alice"), "w").await.unwrap();
    projects.write(&p, "a", b"1".to_vec()).await.unwrap();
    std::fs::create_dir_all(p.dir.join("new-stale/sub")).unwrap();
    let again = projects.open(&caller("alice"), "w").await.unwrap();
    assert!(!p.dir.join("new-stale").exists());
    assert_eq!(
        projects.read(&again, "a", 10).await.unwrap(),
        Some(b"1".to_vec())
    );
}

/// Sets the idle clock of `p` back by `ago`.
fn age(p: &Project, ago: std::time::Duration) {
    let when = std::time::SystemTime::now() - ago;
    std::fs::File::open(&p.dir)
        .unwrap()
        .set_modified(when)
        .unwrap();
}

#[tokio::test]
async fn a_project_nobody_opened_for_the_idle_time_is_removed_with_its_files() {
    let (projects, _d) = projects(1 << 20);
    let day = std::time::Duration::from_secs(86_400);
    let old = with_file(&projects, "alice", "old", "a.txt", b"old").await;
    let fresh = with_file(&projects, "alice", "fresh", "a.txt", b"fresh").await;
    age(&old, 3 * day);
    age(&fresh, 3 * day);
    // opened again since: its clock restarts
    projects.open(&caller("alice"), "fresh").await.unwrap();
    assert_eq!(projects.sweep(2 * day).await.unwrap(), 1);
    assert!(absent(&projects, "alice", "old").await);
    assert!(!old.dir.exists(), "the old project's files are gone");
    let kept = projects
        .find(&caller("alice"), "fresh")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept, fresh);
    assert_eq!(
        projects.read(&kept, "a.txt", 100).await.unwrap(),
        Some(b"fresh".to_vec())
    );
    // nothing else is idle; a project opened after a sweep starts empty
    assert_eq!(projects.sweep(2 * day).await.unwrap(), 0);
    let again = projects.open(&caller("alice"), "old").await.unwrap();
    assert_eq!(projects.read(&again, "a.txt", 100).await.unwrap(), None);
}

#[tokio::test]
async fn a_removal_a_crash_interrupted_is_finished_by_the_next_sweep() {
    let (projects, d) = projects(1 << 20);
    let root = d.path().join("projects");
    std::fs::create_dir_all(root.join("gone-leftover/tree/sub")).unwrap();
    std::fs::write(root.join("gone-leftover/tree/sub/f"), b"x").unwrap();
    assert_eq!(
        projects
            .sweep(std::time::Duration::from_secs(86_400))
            .await
            .unwrap(),
        0
    );
    assert!(!root.join("gone-leftover").exists());
}
