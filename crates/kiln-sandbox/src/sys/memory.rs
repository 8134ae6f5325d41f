//! Memory: a fork-server's anonymous memory collapsed into transparent huge
//! pages once, before it forks, when its server asks for it (issue 28;
//! `ZygoteConfig::huge_pages`: the templates whose forks are one-shot
//! programs, not the one kernels fork; BENCHMARKS.md, "The one-shot
//! templates in 2 MiB pages").
//!
//! A fork copies the page-table entries of every private mapping that holds
//! anonymous pages, one per 4 KiB page (`copy_page_range`); a 2 MiB page is
//! one entry. A child's first write into a shared huge page splits only its
//! own mapping of it and copies one 4 KiB page, as before, so what a fork
//! holds privately does not grow. `MADV_COLLAPSE` needs no system-wide THP
//! setting and marks no mapping `VM_HUGEPAGE`, so `khugepaged` does not
//! collapse the children's copies later.

use std::io;

/// What [`collapse_anonymous_memory`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collapsed {
    /// Huge pages the process's anonymous memory is now held in.
    pub huge_pages: usize,
    /// Stretches the kernel refused (no free huge page, a page it cannot
    /// move): they stay in 4 KiB pages.
    pub refused: usize,
}

/// The huge-page-aligned stretches `(start, length)` of the private writable
/// anonymous mappings in `maps` (the text of `/proc/<pid>/maps`): the brk
/// heap and unnamed mappings; file mappings, stacks and the kernel's own
/// (`[vdso]`, ...) are left alone.
fn anonymous_stretches(maps: &str, huge: usize) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            let name = fields.nth(3); // after offset, device, inode
            if perms != "rw-p" || !matches!(name, None | Some("[heap]")) {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            let start = a.checked_next_multiple_of(huge)?;
            let end = b - b % huge;
            (end > start).then(|| (start, end - start))
        })
        .collect()
}

/// The kernel's PMD-sized huge page, `None` without transparent huge pages.
fn huge_page_size() -> Option<usize> {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&n: &usize| n.is_power_of_two())
}

/// Collapses the calling process's private anonymous memory into transparent
/// huge pages where a whole aligned huge page of it lies in one mapping.
/// Contents and protections are unchanged; a stretch the kernel refuses stays
/// as it was. Fails only when `/proc/self/maps` cannot be read.
pub fn collapse_anonymous_memory() -> io::Result<Collapsed> {
    let Some(huge) = huge_page_size() else {
        return Ok(Collapsed::default());
    };
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut done = Collapsed::default();
    for (start, len) in anonymous_stretches(&maps, huge) {
        // SAFETY: MADV_COLLAPSE only changes which physical pages back the
        // range (their contents are copied, the protections kept); it reads
        // or writes no memory of ours through the pointer, and a range that
        // is no longer mapped as it was in the maps read above is refused
        // by the kernel (an error), not touched.
        let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_COLLAPSE) };
        if r == 0 {
            done.huge_pages += len / huge;
        } else {
            done.refused += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB2: usize = 2 << 20;

    #[test]
    fn only_private_writable_anonymous_mappings_give_aligned_stretches() {
        let maps = "\
55d0c0000000-55d0c0a00000 rw-p 00000000 00:00 0                          [heap]
7f0000100000-7f0000700000 rw-p 00000000 00:00 0 
7f0000800000-7f0000900000 rw-p 00000000 00:00 0 
7f0001000000-7f0001400000 rw-p 00000000 08:01 42                         /usr/lib/libx.so
7f0002000000-7f0002400000 r--p 00000000 00:00 0 
7ffd00000000-7ffd00400000 rw-p 00000000 00:00 0                          [stack]
";
        assert_eq!(
            anonymous_stretches(maps, MIB2),
            vec![
                // the whole heap: its ends are aligned
                (0x55d0_c000_0000, 0xa0_0000),
                // 1 MiB .. 7 MiB: the aligned 2 MiB .. 6 MiB inside it
                (0x7f00_0020_0000, 0x40_0000),
                // the 1 MiB mapping holds no whole huge page; the file
                // mapping, the read-only one and the stack are left out
            ]
        );
    }

    #[test]
    fn a_touched_anonymous_mapping_ends_up_in_huge_pages() {
        let len = 8 << 20;
        // SAFETY: a fresh private anonymous mapping, no address hint; it is
        // written only inside its length and unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: p is the start of len writable bytes mapped above.
        let bytes = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
        for (i, b) in bytes.iter_mut().enumerate().step_by(4096) {
            *b = (i / 4096) as u8;
        }
        let start = p as usize;
        let huge_kib_of_mapping = || {
            let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
            let is_header = |l: &&str| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|f| !f.ends_with(':'))
            };
            smaps
                .lines()
                .skip_while(|l| !l.starts_with(&format!("{start:x}-")))
                .skip(1)
                .take_while(|l| !is_header(l))
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
                .expect("the mapping's AnonHugePages")
        };
        // Other tests of this process fork: a page shared with a child that
        // has not yet executed or exited cannot be collapsed (the kernel
        // refuses the stretch), so a few tries (the fork-server itself
        // collapses before its first fork, with no child yet).
        let mut done = Collapsed::default();
        let mut huge_kib = 0;
        for _ in 0..20 {
            done = collapse_anonymous_memory().expect("collapse");
            huge_kib = huge_kib_of_mapping();
            if huge_kib >= 3 * 2048 || huge_page_size().is_none() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let contents_kept = bytes
            .iter()
            .enumerate()
            .step_by(4096)
            .all(|(i, &b)| b == (i / 4096) as u8);
        // SAFETY: unmaps exactly the mapping made above; bytes is not used after.
        unsafe { libc::munmap(p, len) };
        if huge_page_size().is_none() {
            assert_eq!(done, Collapsed::default());
            return;
        }
        // 8 MiB from an arbitrary page: at least 3 aligned 2 MiB pages inside
        assert!(
            huge_kib >= 3 * 2048,
            "{huge_kib} KiB in huge pages, {done:?}"
        );
        assert!(contents_kept);
    }
}
