use serde_json::json;

use super::*;

fn bridge(limits: PtcLimits) -> Arc<Bridge> {
    Bridge::new(
        Language::resolve("py").expect("py"),
        vec![
            ToolDef {
                name: "a".into(),
                parameters: None,
            },
            ToolDef {
                name: "b".into(),
                parameters: None,
            },
        ],
        limits,
    )
}

fn ok(v: Value) -> ToolResult {
    ToolResult {
        result: v,
        is_error: false,
        error_message: None,
    }
}

#[tokio::test]
async fn calls_made_together_form_one_round_and_results_reach_them() {
    let b = bridge(PtcLimits::default());
    let rounds = tokio::spawn(Arc::clone(&b).rounds());
    let mut rx = b.subscribe();
    let replies = b.submit(vec![("a".into(), json!({"x": 1})), ("b".into(), json!({}))]);
    rx.wait_for(|s| s.rounds == 1).await.expect("round");
    assert!(b.clock().is_paused(), "an open round stops the clock");
    let round = b.open_round();
    let ids: Vec<&str> = round.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["call_001", "call_002"]);
    assert_eq!(round[0].input, json!({"x": 1}));

    // a continuation must answer the whole round
    assert_eq!(
        b.resume(vec![("call_001".into(), ok(json!(1)))]),
        Err(ResumeError::Incomplete("call_002".into()))
    );
    assert_eq!(
        b.resume(vec![("call_009".into(), ok(json!(1)))]),
        Err(ResumeError::UnknownCall("call_009".into()))
    );
    let results = vec![
        ("call_001".to_owned(), ok(json!({"v": 1}))),
        (
            "call_002".to_owned(),
            ToolResult {
                result: Value::Null,
                is_error: true,
                error_message: Some("boom".into()),
            },
        ),
    ];
    assert_eq!(b.resume(results.clone()), Ok(Resumed::Delivered));
    assert!(!b.clock().is_paused());
    let mut replies = replies.into_iter();
    match replies.next().expect("1").await.expect("reply") {
        Reply::Ok(v) => assert_eq!(v, json!({"v": 1})),
        other => panic!("{other:?}"),
    }
    match replies.next().expect("2").await.expect("reply") {
        Reply::Err(m) => assert_eq!(m, "boom"),
        other => panic!("{other:?}"),
    }
    // the same results again: a retry; a different one: a conflict
    assert_eq!(b.resume(results), Ok(Resumed::Repeated));
    assert_eq!(
        b.resume(vec![("call_001".into(), ok(json!({"v": 2})))]),
        Err(ResumeError::Conflict("call_001".into()))
    );
    rounds.abort();
}

#[tokio::test]
async fn an_undeclared_tool_or_one_call_too_many_gives_up() {
    let b = bridge(PtcLimits::default());
    let r = b.submit(vec![("nope".into(), json!({}))]);
    assert_eq!(
        b.failure(),
        Some(BridgeFailure::UnregisteredTool("nope".into()))
    );
    assert!(r.into_iter().next().expect("rx").await.is_err());

    let b = bridge(PtcLimits {
        max_calls: 2,
        ..PtcLimits::default()
    });
    let _r = b.submit(vec![
        ("a".into(), json!({})),
        ("a".into(), json!({})),
        ("a".into(), json!({})),
    ]);
    assert_eq!(b.failure(), Some(BridgeFailure::TooManyCalls(2)));
    assert_eq!(
        b.failure().map(|f| f.to_string()).as_deref(),
        Some("Tool call limit exceeded: at most 2 tool calls per execution")
    );
}

#[tokio::test]
async fn results_past_the_history_budget_are_refused() {
    let b = bridge(PtcLimits {
        max_history_bytes: 10,
        ..PtcLimits::default()
    });
    let rounds = tokio::spawn(Arc::clone(&b).rounds());
    let _r = b.submit(vec![("a".into(), json!({}))]);
    b.subscribe()
        .wait_for(|s| s.rounds == 1)
        .await
        .expect("round");
    assert_eq!(
        b.resume(vec![("call_001".into(), ok(json!("x".repeat(20))))]),
        Err(ResumeError::HistoryTooLarge(10))
    );
    rounds.abort();
}

#[tokio::test]
async fn an_unanswered_round_expires() {
    let b = bridge(PtcLimits {
        state_ttl: Duration::from_millis(100),
        ..PtcLimits::default()
    });
    let rounds = tokio::spawn(Arc::clone(&b).rounds());
    let r = b.submit(vec![("a".into(), json!({}))]);
    b.subscribe().wait_for(|s| s.failed).await.expect("failure");
    assert_eq!(b.failure(), Some(BridgeFailure::Expired));
    match r.into_iter().next().expect("rx").await {
        Ok(Reply::Err(m)) => assert_eq!(m, "Execution not found or expired"),
        other => panic!("{other:?}"),
    }
    rounds.await.expect("rounds ends");
}
