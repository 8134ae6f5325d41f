//! Stable counterparts of the `exec_body` and `multipart` fuzz targets:
//! thousands of generated and mutated `/exec` bodies through
//! `parse_exec_body`, and multipart bodies through the real router on
//! `/v1/upload` and `/v1/upload/batch` over a real store, each checked with
//! the same property code the fuzz targets use (`fuzz/checks/`), so the
//! properties hold in `cargo test` even without nightly and cargo-fuzz.

#[path = "../../../fuzz/checks/relpath.rs"]
mod relpath;

#[path = "../../../fuzz/checks/exec_body.rs"]
mod exec_body;

#[path = "../../../fuzz/checks/multipart.rs"]
mod multipart;

use std::cell::{Cell, RefCell};

use multipart::{Harness, Part};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------- mutation

/// A byte-level edit, like a fuzzer's.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    Truncate(prop::sample::Index),
    Flip(prop::sample::Index, u8),
    Insert(prop::sample::Index, Vec<u8>),
    Remove(prop::sample::Index, prop::sample::Index),
    Duplicate(prop::sample::Index, prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let idx = any::<prop::sample::Index>;
    prop_oneof![
        8 => Just(Mutation::None),
        1 => idx().prop_map(Mutation::Truncate),
        2 => (idx(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        2 => (idx(), prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, v)| Mutation::Insert(i, v)),
        1 => (idx(), idx()).prop_map(|(a, b)| Mutation::Remove(a, b)),
        1 => (idx(), idx()).prop_map(|(a, b)| Mutation::Duplicate(a, b)),
    ]
}

fn mutate(mut bytes: Vec<u8>, m: &Mutation) -> Vec<u8> {
    let span = |a: &prop::sample::Index, b: &prop::sample::Index, len: usize| {
        let (x, y) = (a.index(len + 1), b.index(len + 1));
        (x.min(y), x.max(y))
    };
    match m {
        Mutation::None => {}
        Mutation::Truncate(i) => bytes.truncate(i.index(bytes.len() + 1)),
        Mutation::Flip(i, b) if !bytes.is_empty() => {
            let i = i.index(bytes.len());
            bytes[i] ^= b | 1;
        }
        Mutation::Flip(..) => {}
        Mutation::Insert(i, v) => {
            let i = i.index(bytes.len() + 1);
            bytes.splice(i..i, v.iter().copied());
        }
        Mutation::Remove(a, b) => {
            let (x, y) = span(a, b, bytes.len());
            bytes.drain(x..y);
        }
        Mutation::Duplicate(a, b) => {
            let (x, y) = span(a, b, bytes.len());
            let copy = bytes[x..y].to_vec();
            bytes.splice(y..y, copy);
        }
    }
    bytes
}

// ---------------------------------------------------------------- values

/// Relative names: mostly valid (so requests get far), some hostile.
fn name() -> BoxedStrategy<String> {
    prop_oneof![
        6 => prop::string::string_regex("[a-z0-9_]{1,12}(\\.[a-z]{1,4})?").expect("regex"),
        2 => prop::string::string_regex("([a-z]{1,6}/){1,12}[a-z]{1,6}\\.txt").expect("regex"),
        2 => prop::sample::select(vec![
            "", ".", "..", "../x", "a/../../etc/passwd", "/etc/passwd", "a//b", "a/", "./a",
            "a\\b", "a\0b", "a\nb", "evil\u{202E}txt.exe", "日本/データ.csv", "a..b",
            ".gitignore", "C:\\x", "%2e%2e/x", "a\"b.txt", "a;b=c.txt",
        ])
        .prop_map(str::to_owned),
        1 => prop::string::string_regex("(?s).{0,40}").expect("regex"),
        1 => (250usize..260).prop_map(|n| "a".repeat(n)),
    ]
    .boxed()
}

/// Ids: mostly well-formed nanoids and resource ids, some not.
fn id_like() -> BoxedStrategy<String> {
    prop_oneof![
        4 => prop::string::string_regex("[A-Za-z0-9_-]{21}").expect("regex"),
        2 => prop::string::string_regex("[A-Za-z0-9_:.-]{1,30}").expect("regex"),
        1 => prop::string::string_regex("(?s).{0,12}").expect("regex"),
        1 => (125usize..132).prop_map(|n| "r".repeat(n)),
    ]
    .boxed()
}

fn leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop::string::string_regex("(?s).{0,16}")
            .expect("regex")
            .prop_map(Value::String),
        Just(json!([])),
        Just(json!({})),
    ]
    .boxed()
}

fn number_like() -> BoxedStrategy<Value> {
    prop_oneof![
        4 => (1u64..100_000).prop_map(|n| json!(n)),
        2 => prop::sample::select(vec![
            json!(0), json!(-1), json!(0.5), json!(1500.5), json!(1e308), json!(-1e308),
            json!(u64::MAX), json!("100"), json!("3"), json!("-3"), json!("1e3"), json!(" 7 "),
            json!(3.0), json!("007"),
        ]),
        1 => leaf(),
    ]
    .boxed()
}

/// A JSON object whose keys are each present with their probability.
fn object(fields: Vec<(&'static str, f64, BoxedStrategy<Value>)>) -> BoxedStrategy<Value> {
    let keys: Vec<&'static str> = fields.iter().map(|(k, _, _)| *k).collect();
    let values: Vec<BoxedStrategy<Option<Value>>> = fields
        .into_iter()
        .map(|(_, p, s)| prop::option::weighted(p, s).boxed())
        .collect();
    values
        .prop_map(move |vals| {
            let mut m = Map::new();
            for (k, v) in keys.iter().zip(vals) {
                if let Some(v) = v {
                    m.insert((*k).to_owned(), v);
                }
            }
            Value::Object(m)
        })
        .boxed()
}

/// Mostly a string from `s`, sometimes any other JSON value.
fn string_or_leaf(s: BoxedStrategy<String>) -> BoxedStrategy<Value> {
    prop_oneof![8 => s.prop_map(Value::String), 1 => leaf()].boxed()
}

fn pick(options: &[&'static str]) -> BoxedStrategy<String> {
    prop::sample::select(options.to_vec())
        .prop_map(str::to_owned)
        .boxed()
}

fn file_entry() -> BoxedStrategy<Value> {
    let content = prop_oneof![
        prop::string::string_regex("[A-Za-z0-9+/=]{0,24}").expect("regex"),
        prop::string::string_regex("[0-9a-f]{0,24}").expect("regex"),
        prop::string::string_regex("(?s).{0,24}").expect("regex"),
    ]
    .boxed();
    let inline = object(vec![
        ("name", 0.95, string_or_leaf(name())),
        ("content", 0.97, string_or_leaf(content)),
        (
            "encoding",
            0.5,
            string_or_leaf(pick(&["utf8", "utf-8", "base64", "hex", "rot13"])),
        ),
    ]);
    // G2/G3 references (kind/resource_id/version) and G1 ones (session_id/entity_id).
    let reference = object(vec![
        ("name", 0.95, string_or_leaf(name())),
        ("id", 0.95, string_or_leaf(id_like())),
        ("storage_session_id", 0.7, string_or_leaf(id_like())),
        ("session_id", 0.4, string_or_leaf(id_like())),
        (
            "kind",
            0.6,
            string_or_leaf(pick(&["user", "agent", "skill", "User", "", "other"])),
        ),
        ("resource_id", 0.6, string_or_leaf(id_like())),
        ("version", 0.4, number_like()),
        ("entity_id", 0.3, string_or_leaf(id_like())),
    ]);
    prop_oneof![3 => inline, 4 => reference, 1 => leaf()].boxed()
}

fn exec_body_value() -> BoxedStrategy<Value> {
    let langs = pick(&[
        "py", "python", "Python", "python3", "js", "node", "bash", "sh", "cobol", "", " py ",
    ]);
    let code = prop::string::string_regex("(?s).{0,40}")
        .expect("regex")
        .boxed();
    let args = prop_oneof![
        4 => prop::collection::vec(string_or_leaf(id_like()), 0..4).prop_map(Value::Array),
        1 => leaf(),
    ]
    .boxed();
    let files = prop_oneof![
        6 => prop::collection::vec(file_entry(), 0..3).prop_map(Value::Array),
        1 => leaf(),
    ]
    .boxed();
    prop_oneof![
        12 => object(vec![
            ("lang", 0.95, string_or_leaf(langs)),
            ("code", 0.95, string_or_leaf(code)),
            ("args", 0.3, args),
            ("timeout", 0.4, number_like()),
            ("user_id", 0.4, string_or_leaf(id_like())),
            ("files", 0.6, files),
        ]),
        1 => leaf(),
    ]
    .boxed()
}

// ---------------------------------------------------------------- /exec

proptest! {
    #![proptest_config(config(2500))]

    #[test]
    fn generated_exec_bodies_parse_or_are_refused_with_a_4xx(
        body in exec_body_value(),
        m in mutation(),
    ) {
        let bytes = serde_json::to_vec(&body).expect("serialize");
        exec_body::check_exec_body(&mutate(bytes, &m));
    }
}

/// The generator must produce bodies the parser accepts, or the property
/// of accepted requests holds vacuously.
#[test]
fn generated_exec_bodies_are_often_accepted() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = exec_body_value();
    let accepted = (0..1000)
        .filter(|_| {
            let v = strategy.new_tree(&mut runner).expect("generate").current();
            let bytes = serde_json::to_vec(&v).expect("serialize");
            kiln_api::exec::parse_exec_body(&Default::default(), &Default::default(), &bytes)
                .is_ok()
        })
        .count();
    eprintln!("{accepted} of 1000 generated bodies accepted");
    assert!(
        accepted >= 150,
        "only {accepted} of 1000 generated bodies accepted"
    );
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn arbitrary_bytes_as_exec_body_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        exec_body::check_exec_body(&bytes);
    }
}

// ---------------------------------------------------------------- uploads

fn field(name: &str, value: &str) -> Part {
    Part::Field {
        name: name.to_owned(),
        value: value.as_bytes().to_vec(),
    }
}

/// The scope fields before the files: mostly a coherent scope, sometimes
/// arbitrary fields.
fn scope_fields() -> BoxedStrategy<Vec<Part>> {
    let coherent = prop::sample::select(vec![
        vec![],
        vec![field("entity_id", "agent_1")],
        vec![field("entity_id", "fuzz-user")],
        vec![field("kind", "agent"), field("id", "agent_1")],
        vec![field("kind", "user"), field("id", "fuzz-user")],
        vec![
            field("kind", "skill"),
            field("id", "sk"),
            field("version", "3"),
        ],
        vec![field("read_only", "true")],
        vec![field("other", "ignored"), field("read_only", "0")],
    ]);
    let names = pick(&[
        "kind",
        "id",
        "version",
        "read_only",
        "entity_id",
        "other",
        "",
        "na\"me",
    ]);
    let values = prop_oneof![
        4 => pick(&[
            "user", "agent", "skill", "bogus", "", "agent_1", "fuzz-user", "3", "-1", "true",
            "TRUE", "maybe", "a b", "x/../y",
        ])
        .prop_map(String::into_bytes),
        1 => Just(vec![b'x'; 5000]),
        1 => Just(vec![0xff, 0xfe, 0x00]),
    ];
    let arbitrary = prop::collection::vec(
        (names, values).prop_map(|(name, value)| Part::Field { name, value }),
        1..4,
    );
    prop_oneof![4 => coherent, 1 => arbitrary].boxed()
}

/// A file part: mostly a `file`/`files` part with a filename.
fn file_part() -> BoxedStrategy<Part> {
    let fields = prop_oneof![
        6 => pick(&["file", "files"]),
        1 => pick(&["upload", "", "fi\"le", "kind"]),
    ];
    let content_types = prop::option::of(pick(&[
        "text/plain",
        "application/octet-stream",
        "",
        "image/png",
        "a\u{1}b",
    ]));
    let content = prop_oneof![
        6 => prop::collection::vec(any::<u8>(), 0..64),
        1 => (0usize..1100).prop_map(|n| vec![b'z'; n]),
    ];
    (
        fields,
        prop::option::weighted(0.9, name()),
        content_types,
        content,
    )
        .prop_map(|(field, filename, content_type, content)| Part::File {
            field,
            filename,
            content_type,
            content,
        })
        .boxed()
}

/// A form: scope fields, then file parts, sometimes a field after them.
fn form() -> BoxedStrategy<Vec<Part>> {
    (
        scope_fields(),
        prop::collection::vec(file_part(), 0..5),
        prop::option::weighted(0.1, scope_fields()),
    )
        .prop_map(|(mut parts, files, late)| {
            parts.extend(files);
            parts.extend(late.into_iter().flatten());
            parts
        })
        .boxed()
}

fn boundary() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "X-BOUNDARY",
            "b",
            "----WebKitFormBoundary7MA4YWxkTrZu0gW"
        ])
        .prop_map(str::to_owned),
        prop::string::string_regex("[A-Za-z0-9'()+_,./:=?-]{1,70}").expect("regex"),
    ]
}

#[test]
fn generated_multipart_uploads_never_fail_the_server_or_store_unsafe_names() {
    let harness = RefCell::new(Harness::new());
    let (cases, stored) = (Cell::new(0usize), Cell::new(0usize));
    proptest!(config(3000), |(
        flags in 0u8..8,
        boundary in boundary(),
        parts in form(),
        m in mutation(),
    )| {
        let body = multipart::render(&boundary, &parts);
        let input = mutate(multipart::encode(flags, &boundary, &body), &m);
        cases.set(cases.get() + 1);
        stored.set(stored.get() + harness.borrow_mut().check(&input));
    });
    eprintln!("{} cases stored {} files", cases.get(), stored.get());
    // The generator must reach the store, or the property holds vacuously.
    assert!(cases.get() >= 3000 && stored.get() >= 200);
}

#[test]
fn arbitrary_bytes_as_multipart_never_fail_the_server() {
    let harness = RefCell::new(Harness::new());
    proptest!(config(1000), |(
        flags in 0u8..8,
        body in prop::collection::vec(any::<u8>(), 0..512),
    )| {
        harness.borrow_mut().check(&multipart::encode(flags, "X-BOUNDARY", &body));
    });
}

/// The harness itself must be able to see a stored file: a valid upload is
/// stored, reported and found in the store (else the properties above
/// would pass vacuously).
#[test]
fn a_valid_upload_is_stored_and_checked() {
    let body = multipart::render(
        "X-BOUNDARY",
        &[
            Part::Field {
                name: "entity_id".into(),
                value: b"agent_1".to_vec(),
            },
            Part::File {
                field: "file".into(),
                filename: Some("data/a.csv".into()),
                content_type: None,
                content: b"a,b\n".to_vec(),
            },
        ],
    );
    let mut h = Harness::new();
    for flags in [0, multipart::BATCH, multipart::USER_ID | multipart::STRICT] {
        assert_eq!(h.check(&multipart::encode(flags, "X-BOUNDARY", &body)), 1);
    }
}
