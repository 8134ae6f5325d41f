//! Nothing outlives a run: after successful, failing, timed-out, cancelled
//! and abandoned (future dropped) runs, and warm jails run, discarded or
//! dropped while parked, no run cgroup of this process and no
//! process of the slots' uids remains. One test, so no other run of this
//! binary overlaps the final check.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kiln_core::Limits;
use kiln_sandbox::SandboxError;
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_800_000_000;

#[tokio::test]
async fn no_cgroup_or_process_survives_any_kind_of_run() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let short = Limits {
        wall_time: Duration::from_millis(500),
        ..limits()
    };
    let sleeper = ["/bin/sh", "-c", "(setsid sleep 300 &); sleep 100"];

    // Success, setup failure (exec), timeout.
    let ok = sb
        .run(
            &slot,
            request(&ws, &["/bin/true"], limits()),
            CancellationToken::new(),
        )
        .await
        .expect("run");
    assert!(!ok.timed_out);
    let exec = sb
        .run(
            &slot,
            request(&ws, &["/nope"], limits()),
            CancellationToken::new(),
        )
        .await;
    assert!(matches!(exec, Err(SandboxError::Exec(_))), "{exec:?}");
    let timeout = sb
        .run(
            &slot,
            request(&ws, &sleeper, short.clone()),
            CancellationToken::new(),
        )
        .await
        .expect("run");
    assert!(timeout.timed_out);

    // Cancelled.
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let cancelled = tokio::join!(
        sb.run(&slot, request(&ws, &sleeper, limits()), cancel),
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            trigger.cancel();
        }
    )
    .0;
    assert!(matches!(cancelled, Err(SandboxError::Cancelled(_))));
    assert!(own_run_cgroups(sb).is_empty(), "{:?}", own_run_cgroups(sb));
    assert!(host_pids_of_slot(&slot).is_empty());

    // Abandoned: the caller drops the future mid-run. The helper is
    // SIGKILLed (kill_on_drop), the jail dies through its parent-death
    // signal and a background thread removes the cgroups.
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        sb.run(
            &slot,
            request(&ws, &sleeper, limits()),
            CancellationToken::new(),
        ),
    )
    .await;
    assert!(abandoned.is_err(), "the run must still be going");
    let started = Instant::now();
    loop {
        let cgroups = own_run_cgroups(sb);
        let pids = host_pids_of_slot(&slot);
        if cgroups.is_empty() && pids.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "left behind: cgroups {cgroups:?}, pids {pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Warm jails: one run to the end, one discarded, one dropped while
    // parked (the helper is killed, a background thread removes its groups).
    let spec = kiln_sandbox::ParkSpec::exec();
    let jail = sb.park(&slot, &spec, &limits(), None).await.expect("park");
    let mut req = request(&ws, &["/bin/true"], limits());
    req.workspace = jail.workspace().to_path_buf();
    sb.run_parked(&slot, jail, req, CancellationToken::new())
        .await
        .expect("parked run");
    let jail = sb.park(&slot, &spec, &limits(), None).await.expect("park");
    sb.discard(jail).await;
    assert!(own_run_cgroups(sb).is_empty(), "{:?}", own_run_cgroups(sb));
    assert!(host_pids_of_slot(&slot).is_empty());
    let jail = sb.park(&slot, &spec, &limits(), None).await.expect("park");
    drop(jail);
    let started = Instant::now();
    while !(own_run_cgroups(sb).is_empty() && host_pids_of_slot(&slot).is_empty()) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a dropped parked jail left {:?} {:?}",
            own_run_cgroups(sb),
            host_pids_of_slot(&slot)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The slot is reusable afterwards.
    let id_base = slot.id_base();
    drop(slot);
    let again = tokio::time::timeout(Duration::from_secs(5), sb.acquire_slot())
        .await
        .expect("slot returned");

    // Shut down, the slots' kept groups go too: nothing of this process is
    // left under the kiln parents.
    let started = Instant::now();
    while slot_groups(sb, id_base).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the slot never got its kept groups: {:?}",
            own_cgroups(sb)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(again);
    sb.shutdown();
    assert!(own_cgroups(sb).is_empty(), "{:?}", own_cgroups(sb));
}
