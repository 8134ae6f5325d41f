//! The output allow-list: which files in `/mnt/data` are reported as outputs.
//!
//! A file is reported when its lower-cased extension, or its whole basename
//! with a dot prefixed (`Dockerfile` → `.dockerfile`), is in the list.
//! `.dirkeep` markers are always reported.

/// Extensions (and dotted basenames) reported as outputs.
pub static ALLOWED: &[&str] = &[
    // code
    ".c",
    ".cs",
    ".cpp",
    ".go",
    ".java",
    ".js",
    ".kt",
    ".kts",
    ".lua",
    ".php",
    ".pl",
    ".ps1",
    ".py",
    ".r",
    ".rb",
    ".rs",
    ".scala",
    ".sh",
    ".sql",
    ".swift",
    ".ts",
    ".jsx",
    ".tsx",
    ".groovy",
    // web / markup
    ".css",
    ".htm",
    ".html",
    ".less",
    ".sass",
    ".scss",
    ".svg",
    ".svelte",
    ".vue",
    // docs / text
    ".adoc",
    ".asciidoc",
    ".md",
    ".rst",
    ".tex",
    ".txt",
    ".wiki",
    // data
    ".csv",
    ".json",
    ".bson",
    ".json5",
    ".jsonl",
    ".parquet",
    ".tsv",
    ".xml",
    ".yaml",
    ".yml",
    // calendar
    ".ics",
    ".ical",
    ".ifb",
    ".icalendar",
    // config
    ".conf",
    ".env",
    ".gitignore",
    ".ini",
    ".properties",
    ".toml",
    // office
    ".doc",
    ".docx",
    ".pdf",
    ".ppt",
    ".pptx",
    ".xls",
    ".xlsx",
    ".odt",
    ".ods",
    ".odp",
    ".rtf",
    // images
    ".avif",
    ".bmp",
    ".gif",
    ".ico",
    ".jpeg",
    ".jpg",
    ".png",
    ".tif",
    ".tiff",
    ".webp",
    // fonts
    ".eot",
    ".ttf",
    ".woff",
    ".woff2",
    // archives
    ".7z",
    ".bz2",
    ".gz",
    ".gzip",
    ".rar",
    ".tar",
    ".zip",
    // infra
    ".tf",
    ".tfvars",
    ".tfstate",
    ".hcl",
    // dotfile / basename forms
    ".dockerfile",
    ".dockerignore",
    ".helmignore",
    ".helmfile",
    ".jenkinsfile",
    ".vagrantfile",
    ".eslintrc",
    ".prettierrc",
    ".editorconfig",
    ".nomad",
    // misc
    ".bat",
    ".cmd",
    ".deb",
    ".log",
    ".rpm",
    ".vbs",
    // empty-directory marker
    ".dirkeep",
];

/// Name of the marker that preserves an empty directory.
pub const DIRKEEP: &str = ".dirkeep";

/// True when a file with this basename is reported as an output.
pub fn is_reportable(basename: &str) -> bool {
    let lower = basename.to_ascii_lowercase();
    if let Some(dot) = lower.rfind('.') {
        let ext = &lower[dot..];
        if ext.len() > 1 && ALLOWED.contains(&ext) {
            return true;
        }
    }
    // whole basename as a dotted form: `Dockerfile` → `.dockerfile`,
    // `.gitignore` → `.gitignore`
    let dotted = if lower.starts_with('.') {
        lower
    } else {
        format!(".{lower}")
    };
    ALLOWED.contains(&dotted.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_common_outputs() {
        for name in [
            "a.csv", "plot.PNG", "r.xlsx", "x.tar.gz", "notes.md", "main.py", ".dirkeep",
        ] {
            assert!(is_reportable(name), "{name}");
        }
    }

    #[test]
    fn reports_dotted_basenames() {
        for name in [
            "Dockerfile",
            "Jenkinsfile",
            "Vagrantfile",
            ".gitignore",
            ".env",
        ] {
            assert!(is_reportable(name), "{name}");
        }
    }

    #[test]
    fn ignores_unlisted_types_and_extensionless_files() {
        for name in [
            "model.pkl",
            "a.npy",
            "db.sqlite",
            "song.mp3",
            "README",
            "binary",
            "x.",
        ] {
            assert!(!is_reportable(name), "{name}");
        }
    }
}
