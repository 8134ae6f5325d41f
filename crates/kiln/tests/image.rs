//! Jails on a runtime image (docs/runtimes.md): every interpreter a run sees is the image's,
//! whatever the host has, and the document tools work inside a jail under the default limits.
//!
//! Needs a built image: `KILN_RUNTIME_IMAGE` names it (default: `default`, the compiled-in
//! recipe's, built by `kiln runtime build`) in `KILN_RUNTIME_DIR` (default
//! `/var/lib/kiln/runtimes`). Without one the tests skip with a printed reason, or FAIL when
//! `CI` is set.

mod common;

use common::*;
use kiln::runtime::Store;
use kiln::testing::TestServer;
use serde_json::Value;

fn image_name() -> String {
    std::env::var("KILN_RUNTIME_IMAGE")
        .ok()
        .filter(|v| !v.is_empty() && v != "host")
        .unwrap_or_else(|| "default".to_owned())
}

/// The image's root filesystem, or `None` (skip) when it is not built.
fn image_root() -> Option<std::path::PathBuf> {
    let cfg = kiln::config::Config::default();
    let dir = std::env::var_os("KILN_RUNTIME_DIR").map_or(cfg.runtime_dir, Into::into);
    match Store::new(dir).resolve(&image_name()) {
        Ok(root) => Some(root),
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "{e:#}");
            eprintln!("SKIP: {e:#}");
            None
        }
    }
}

/// A server on the image, or `None` (skip) when it is not built.
async fn image_server() -> Option<TestServer> {
    image_root()?;
    Some(server_with(|c| c.runtime_image = image_name()).await)
}

/// What `/health` says of language `name` (null when it names none).
async fn health_of_language(s: &TestServer, name: &str) -> Value {
    let health: Value = json_of(client().get(format!("{}/health", s.v1()))).await;
    health["languages"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == name))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn probing_the_languages_leaves_the_shared_image_untouched() {
    let Some(root) = image_root() else {
        return;
    };
    // java's version probe used to leave /tmp/hsperfdata_root in the image
    let left = root.join("tmp/hsperfdata_root");
    let _ = std::fs::remove_dir_all(&left);
    let s = image_server().await.expect("the image is there");
    let java = health_of_language(&s, "java").await;
    assert_eq!(java["available"], true, "{java}");
    assert!(!left.exists(), "{} written by a probe", left.display());
}

fn stdout(r: &Value) -> &str {
    r["stdout"].as_str().unwrap_or_default()
}

/// The host's `python3 --version`, if it has one.
fn host_python() -> Option<String> {
    let out = std::process::Command::new("/usr/bin/python3")
        .arg("--version")
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn every_interpreter_a_run_sees_is_the_images_not_the_hosts() {
    let Some(s) = image_server().await else {
        return;
    };
    // the health answer names the image
    let health: Value = json_of(client().get(format!("{}/health", s.v1()))).await;
    let id = health["runtime_image"]["id"].as_str().unwrap_or_default();
    assert!(
        id.starts_with("recipe-") || id.starts_with("import-") || id.starts_with('/'),
        "{health}"
    );
    // and each language's version is the image's, probed in a chroot of it
    let version = |name: &str| {
        health["languages"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["name"] == name)
            .and_then(|l| l["version"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    for (lang, want) in [
        ("py", "Python 3.13."),
        ("java", "openjdk 21."),
        ("go", "go1.24"),
        ("r", "version 4.5"),
    ] {
        assert!(version(lang).contains(want), "{lang}: {health}");
    }

    let r = run(
        &s,
        "py",
        "import sys, platform, pandas as pd, numpy, pyarrow\n\
         print(platform.python_version(), pd.__version__.split('.')[0], numpy.__version__.split('.')[0])\n\
         df = pd.DataFrame({'a': [1, 2]})\n\
         print(df[['a']].map(lambda v: v * 10)['a'].tolist())\n\
         df.to_parquet('t.parquet')\n\
         print(pd.read_parquet('t.parquet', dtype_backend='pyarrow')['a'].dtype)\n",
    )
    .await;
    let out = stdout(&r);
    assert!(out.starts_with("3.13."), "{r}");
    assert!(out.contains(" 2 2\n"), "pandas 2, numpy 2: {r}");
    assert!(out.contains("[10, 20]"), "DataFrame.map: {r}");
    assert!(out.contains("int64[pyarrow]"), "pyarrow dtypes: {r}");
    if let Some(host) = host_python() {
        assert!(
            !host.ends_with(out.split_whitespace().next().unwrap_or("-")),
            "the host's python ({host}) is the jail's: {r}"
        );
    }

    // every other runtime, by its version line, from bash in the same image
    let r = run(
        &s,
        "bash",
        "node --version; go version; rustc --version; java -Xmx64m -version 2>&1 | head -1; \
         php -r 'echo PHP_VERSION, \"\\n\";'; Rscript -e 'cat(R.version$major, R.version$minor, \"\\n\")'; \
         gcc --version | head -1; esbuild --version; rg --version | head -1; \
         ls /usr/lib/python3.11 2>/dev/null || echo no-python3.11",
    )
    .await;
    let out = stdout(&r);
    for want in [
        "v26.",
        "go1.24",
        "rustc 1.85",
        "\"21.",
        "8.4.",
        "4 5.",
        "(Debian 14.",
        "ripgrep ",
        "no-python3.11",
    ] {
        assert!(out.contains(want), "{want} missing: {r}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn js_and_ts_run_the_pinned_official_node_with_its_start_up_snapshot() {
    // like the version checks above, this holds the image to the default recipe's pins
    let Some(s) = image_server().await else {
        return;
    };
    let recipe = kiln::runtime::Recipe::parse(kiln::runtime::DEFAULT_RECIPE).unwrap();
    let node = recipe.node.expect("the default recipe pins node");
    let pin = node.pin(kiln::runtime::node::npm_arch()).unwrap();
    // Debian's nodejs is built without V8's start-up snapshot and code cache, the official
    // build with both; the version is the pinned one, not Debian's 20.19
    let probe = "const v = process.config.variables;\n\
                 console.log(process.version, process.execPath, \
                 v.node_use_node_snapshot, v.node_use_node_code_cache, v.node_shared);\n";
    let want = format!("v{} {} true true false\n", pin.version, node.bin);
    for lang in ["js", "ts"] {
        let r = run(&s, lang, probe).await;
        assert_eq!(stdout(&r), want, "{lang}: {r}");
    }
    let js = health_of_language(&s, "js").await;
    assert_eq!(js["version"], format!("v{}", pin.version), "{js}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_left_at_its_default_runs_nothing_from_the_hosts_usr() {
    // the configuration's own default, whatever KILN_RUNTIME_IMAGE says
    let default = kiln::config::Config::default().runtime_image;
    let dir = std::env::var_os("KILN_RUNTIME_DIR")
        .map_or(kiln::config::Config::default().runtime_dir, Into::into);
    if let Err(e) = Store::new(dir).resolve(&default) {
        assert!(std::env::var_os("CI").is_none(), "{e:#}");
        eprintln!("SKIP: {e:#}");
        return;
    }
    let s = server_with(|c| c.runtime_image = default).await;
    let health: Value = json_of(client().get(format!("{}/health", s.v1()))).await;
    let id = health["runtime_image"]["id"].as_str().unwrap_or_default();
    assert!(id.starts_with("recipe-"), "{health}");
    let r = run(
        &s,
        "bash",
        "python3 -c 'import sys; print(sys.version_info[:2])'; \
         ls /usr/lib/python3.11 2>/dev/null || echo no-python3.11",
    )
    .await;
    let out = stdout(&r);
    assert!(out.contains("(3, 13)"), "{r}");
    assert!(out.contains("no-python3.11"), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn documents_convert_inside_a_jail_under_the_default_limits() {
    let Some(s) = image_server().await else {
        return;
    };
    let r = run(
        &s,
        "bash",
        "set -e\n\
         printf '# Quarterly report\\n\\nRevenue grew *12%%* in 第三季度.\\n' > report.md\n\
         pandoc report.md -o report.docx\n\
         soffice --headless -env:UserInstallation=file:///tmp/lo --convert-to pdf --outdir . report.docx >/dev/null 2>&1\n\
         pdftotext report.pdf - | tr -s '\\n' ' '; echo\n\
         qpdf --check report.pdf | grep -o 'No syntax or stream encoding errors'\n\
         qpdf --empty --pages report.pdf report.pdf -- twice.pdf\n\
         qpdf --show-npages twice.pdf\n\
         rm report.md\n",
    )
    .await;
    assert_eq!(r["code"], 0, "{r}");
    let out = stdout(&r);
    assert!(out.contains("Quarterly report"), "pdftotext: {r}");
    assert!(
        out.contains("第三季度"),
        "CJK text survives docx → PDF: {r}"
    );
    assert!(
        out.contains("No syntax or stream encoding errors"),
        "qpdf --check: {r}"
    );
    assert!(out.trim_end().ends_with('2'), "qpdf --pages: {r}");
    let mut names: Vec<&str> = r["files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["report.docx", "report.pdf", "twice.pdf"], "{r}");
    let bytes = output_bytes(&s, &r, "report.pdf").await;
    assert!(bytes.starts_with(b"%PDF-"), "a PDF comes back");
}

/// What the docx/pptx/xlsx/pdf skills import beyond the data stack (docs/runtimes.md, "What
/// programs import"): PDF text through pdfplumber, pages rendered by pdf2image and read back by
/// tesseract, a pptx read back as Markdown by markitdown; and the R graphics LibreChat's own code
/// tool prescribes (`library(Cairo)`).
#[tokio::test(flavor = "multi_thread")]
async fn what_the_document_skills_and_librechats_code_tool_import_is_in_the_image() {
    let Some(s) = image_server().await else {
        return;
    };
    let r = run(
        &s,
        "py",
        "from reportlab.pdfgen import canvas\n\
         c = canvas.Canvas('scan.pdf'); c.setFont('Helvetica', 28)\n\
         c.drawString(72, 700, 'Invoice 4711 paid'); c.save()\n\
         import pdfplumber, pypdfium2, defusedxml\n\
         with pdfplumber.open('scan.pdf') as pdf:\n\
         \x20   print('text:', pdf.pages[0].extract_text())\n\
         from pdf2image import convert_from_path\n\
         import pytesseract\n\
         page = convert_from_path('scan.pdf', dpi=150)[0]\n\
         print('ocr:', pytesseract.image_to_string(page).strip())\n\
         from pptx import Presentation\n\
         deck = Presentation(); slide = deck.slides.add_slide(deck.slide_layouts[1])\n\
         slide.shapes.title.text = 'Quarterly numbers'; deck.save('deck.pptx')\n\
         from markitdown import MarkItDown\n\
         print('md:', MarkItDown().convert('deck.pptx').text_content.split('\\n')[1])\n",
    )
    .await;
    assert_eq!(r["code"], 0, "{r}");
    let out = stdout(&r);
    assert!(out.contains("text: Invoice 4711 paid"), "pdfplumber: {r}");
    assert!(out.contains("ocr: Invoice 4711 paid"), "tesseract: {r}");
    assert!(out.contains("md: # Quarterly numbers"), "markitdown: {r}");

    let r = run(
        &s,
        "r",
        "library(Cairo)\nCairoPNG('cairo.png', width = 400, height = 300)\nplot(1:10)\ninvisible(dev.off())\ncat('drawn\\n')\n",
    )
    .await;
    assert_eq!(r["code"], 0, "{r}");
    assert_eq!(stdout(&r), "drawn\n", "{r}");
    let bytes = output_bytes(&s, &r, "cairo.png").await;
    assert!(bytes.starts_with(b"\x89PNG"), "a PNG comes back");
}

/// The skills' JavaScript (docx, pptxgenjs, pdf-lib) is installed in the image and reached
/// from a program's own directory by `require` and by ES `import` alike (the image's
/// `/node_modules` link, replicated into every jail).
#[tokio::test(flavor = "multi_thread")]
async fn the_skills_javascript_packages_load_by_require_and_by_import() {
    let Some(s) = image_server().await else {
        return;
    };
    let r = run(
        &s,
        "js",
        "const fs = require('fs');\n\
         const { Document, Packer, Paragraph } = require('docx');\n\
         const PptxGenJS = require('pptxgenjs');\n\
         const { PDFDocument } = require('pdf-lib');\n\
         (async () => {\n\
           const doc = new Document({ sections: [{ children: [new Paragraph('Minutes')] }] });\n\
           fs.writeFileSync('minutes.docx', await Packer.toBuffer(doc));\n\
           const deck = new PptxGenJS(); deck.addSlide().addText('Q3', { x: 1, y: 1 });\n\
           await deck.writeFile({ fileName: 'q3.pptx' });\n\
           const pdf = await PDFDocument.create(); pdf.addPage();\n\
           fs.writeFileSync('blank.pdf', await pdf.save());\n\
           console.log('written');\n\
         })();\n",
    )
    .await;
    assert_eq!(r["code"], 0, "{r}");
    assert_eq!(stdout(&r), "written\n", "{r}");
    assert!(
        output_bytes(&s, &r, "minutes.docx")
            .await
            .starts_with(b"PK")
    );
    assert!(output_bytes(&s, &r, "q3.pptx").await.starts_with(b"PK"));
    assert!(
        output_bytes(&s, &r, "blank.pdf")
            .await
            .starts_with(b"%PDF-")
    );

    let r = run(
        &s,
        "js",
        "import { PDFDocument } from 'pdf-lib';\n\
         import pptxgen from 'pptxgenjs';\n\
         const pdf = await PDFDocument.create();\n\
         pdf.addPage(); pdf.addPage();\n\
         console.log(pdf.getPageCount(), typeof pptxgen);\n",
    )
    .await;
    assert_eq!(r["code"], 0, "{r}");
    assert_eq!(stdout(&r), "2 function\n", "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_fork_server_and_live_kernels_run_the_images_python() {
    let Some(s) = image_server().await else {
        return;
    };
    // the fork-server embeds the image's libpython (inside the image's system)
    assert!(
        s.wait_warm("py-data", std::time::Duration::from_secs(180))
            .await,
        "the py-data fork-server must start on the image"
    );
    // a warm run is a fork of the image's preloaded template: pandas 2 is
    // already imported, the interpreter is the image's 3.13
    let r = run(
        &s,
        "py",
        "import sys, time\nt = time.perf_counter()\nimport pandas\nprint(sys.version_info[:2] == (3, 13), pandas.__version__.split('.')[0], 'pandas' in sys.modules, time.perf_counter() - t < 0.05)",
    )
    .await;
    assert_eq!(stdout(&r), "True 2 True True\n", "{r}");
    // a live kernel (a fork of the template) keeps its state on the image
    let created: Value = json_of(
        client()
            .post(format!("{}/sessions", s.v1()))
            .json(&serde_json::json!({"lang": "py"})),
    )
    .await;
    let id = created["session_id"].as_str().expect("session_id");
    let eval = |code: &str| {
        client()
            .post(format!("{}/sessions/{id}/exec", s.v1()))
            .json(&serde_json::json!({ "code": code }))
    };
    let (status, first) = status_json(eval("import sys\nv = sys.version_info[1]")).await;
    assert_eq!(status, 200, "{first}");
    let (status, second) = status_json(eval("print(v)")).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["stdout"], "13\n", "{second}");
}

/// A hard-linked copy (`cp -al`) of the image at `root`, beside it (the same filesystem),
/// with a marker file only the copy has: a second image that costs no disk. Removed on drop
/// (only links are removed; the image's files stay).
fn marked_copy(root: &std::path::Path) -> tempfile::TempDir {
    let store_dir = root
        .parent()
        .and_then(|d| d.parent())
        .expect("the store dir");
    // not an image id: the store never takes it for one of its images
    let dir = tempfile::Builder::new()
        .prefix(".kiln-test-copy-")
        .tempdir_in(store_dir)
        .expect("a directory beside the image");
    let copy = dir.path().join("rootfs");
    let ok = std::process::Command::new("cp")
        .arg("-al")
        .arg(root)
        .arg(&copy)
        .status()
        .expect("run cp");
    assert!(ok.success(), "cp -al {}", root.display());
    // a new file, not a write through a link: the image itself is untouched
    std::fs::write(copy.join("usr/share/kiln-test-marker"), "the copy\n").unwrap();
    dir
}

/// `/health`'s entry of the language `name`.
fn language<'a>(health: &'a Value, name: &str) -> &'a Value {
    health["languages"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == name))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread")]
async fn each_language_runs_from_the_image_chosen_for_it_and_not_from_the_others() {
    let Some(root) = image_root() else {
        return;
    };
    let Some(host) = host_python() else {
        eprintln!("SKIP: the host has no python3 to run py from");
        return;
    };
    let copy = marked_copy(&root);
    let copy_root = copy.path().join("rootfs");
    let s = server_with(|c| {
        c.runtime_image = image_name();
        // bash from the marked copy, py from the host's /usr, every other language from
        // runtime_image
        c.runtime_images =
            kiln::config::RuntimeImages::Line(format!("bash={},py=host", copy_root.display()));
        c.python_template = "data".into();
        // a parked jail for each profile: exec, exec@bash (the copy's), exec@py (the
        // host's), js, py-data
        c.warm_jails = 5;
        c.warm_per_runtime = 1;
    })
    .await;
    // py's fork-server starts on py's system (the host's python)
    assert!(
        s.wait_warm("py-data", std::time::Duration::from_secs(180))
            .await,
        "the py-data fork-server must start on the host's python: {:?}",
        s.warm.as_ref().map(kiln_sandbox::WarmPool::stats)
    );

    // /health names each language's image and the version probed in it
    let health: Value = json_of(client().get(format!("{}/health", s.v1()))).await;
    let default_id = health["runtime_image"]["id"].as_str().unwrap_or_default();
    assert!(!default_id.is_empty(), "{health}");
    assert_eq!(
        language(&health, "bash")["image"]["id"],
        copy_root.display().to_string(),
        "{health}"
    );
    assert_eq!(language(&health, "py")["image"], Value::Null, "{health}");
    assert_eq!(language(&health, "py")["version"], host, "{health}");
    assert_eq!(
        language(&health, "js")["image"]["id"],
        default_id,
        "{health}"
    );
    assert!(
        language(&health, "r")["version"]
            .as_str()
            .unwrap_or_default()
            .contains("version 4.5"),
        "r runs from the default image: {health}"
    );

    // what each language's jails see, several times: warm jails (the default image's
    // generic ones, the copy's own, py's fork-server on the host) and cold ones alike
    let probe = "cat /usr/share/kiln-test-marker 2>/dev/null || echo no-marker; \
                 ls -d /usr/lib/python3.11 2>/dev/null || echo no-python3.11";
    for _ in 0..3 {
        let r = run(&s, "bash", probe).await;
        assert_eq!(
            stdout(&r),
            "the copy\nno-python3.11\n",
            "bash on the copy: {r}"
        );
        let r = run(
            &s,
            "js",
            "const fs = require('fs');\n\
             console.log(fs.existsSync('/usr/share/kiln-test-marker'), fs.existsSync('/usr/lib/python3.11'));",
        )
        .await;
        assert_eq!(stdout(&r), "false false\n", "js on the default image: {r}");
        let r = run(
            &s,
            "py",
            "import os, platform\n\
             print(platform.python_version(), os.path.exists('/usr/share/kiln-test-marker'))",
        )
        .await;
        let want = format!("{} False\n", host.trim_start_matches("Python "));
        assert_eq!(stdout(&r), want, "py on the host's /usr: {r}");
        let r = run(
            &s,
            "r",
            "cat(file.exists('/usr/share/kiln-test-marker'), R.version$minor, '\\n')",
        )
        .await;
        assert!(
            stdout(&r).starts_with("FALSE 5."),
            "r on the default image: {r}"
        );
    }

    // programmatic-tool runs (a jail built for its tool channel) too
    for (lang, code, want) in [
        (
            "bash",
            "cat /usr/share/kiln-test-marker",
            "the copy\n".to_owned(),
        ),
        (
            "py",
            "import platform\nprint(platform.python_version())",
            format!("{}\n", host.trim_start_matches("Python ")),
        ),
    ] {
        let (status, done) = status_json(
            client()
                .post(format!("{}/exec/programmatic", s.v1()))
                .header("User-Id", "alice")
                .json(&serde_json::json!({"code": code, "lang": lang,
                    "tools": [{"name": "unused"}]})),
        )
        .await;
        assert_eq!(status, 200, "{done}");
        assert_eq!(done["status"], "completed", "{lang}: {done}");
        assert_eq!(done["stdout"], want, "{lang} programmatic: {done}");
    }

    // a live py kernel forks the fork-server of py's own system
    let created: Value = json_of(
        client()
            .post(format!("{}/sessions", s.v1()))
            .json(&serde_json::json!({"lang": "py"})),
    )
    .await;
    if let Some(id) = created["session_id"].as_str() {
        let (status, r) = status_json(
            client()
                .post(format!("{}/sessions/{id}/exec", s.v1()))
                .json(&serde_json::json!({"code": "import platform\nprint(platform.python_version())"})),
        )
        .await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(
            r["stdout"].as_str().unwrap_or_default().trim(),
            host.trim_start_matches("Python "),
            "the kernel runs py's image (the host's): {r}"
        );
    } else {
        panic!("no py kernel on the host's python: {created}");
    }
    drop(s);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_language_image_that_is_not_there_refuses_the_start_in_one_line_naming_it() {
    require_root();
    for (images, says) in [
        (
            "r=import-0123456789abcdef",
            "runtime_images.r: runtime image import-0123456789abcdef is not in",
        ),
        ("js=/nonexistent-root", "runtime_images.js: "),
    ] {
        let err = kiln::testing::TestServer::start(
            std::path::Path::new(env!("CARGO_BIN_EXE_kiln")),
            |c| {
                c.uid_base = fresh_uid_base();
                c.runtime_image = "host".to_owned();
                c.runtime_images = kiln::config::RuntimeImages::Line(images.to_owned());
            },
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("{images}: the server started"));
        let msg = format!("{err:#}");
        assert!(msg.contains(says), "{images}: {msg}");
        assert!(!msg.contains('\n'), "{images}: one line: {msg}");
    }
}
