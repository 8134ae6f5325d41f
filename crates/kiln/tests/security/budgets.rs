//! Host-wide and per-user kernel budgets: what one jail takes must never
//! be missing from the host or from other jails.

use crate::*;

#[tokio::test]
async fn native_aio_cannot_reserve_the_host_wide_budget() {
    // io_setup(65536, &ctx): one jail used to take all of fs.aio-max-nr.
    let code = format!(
        "{PY_SYSCALL}\nctx = ctypes.c_ulong(0)\ndenied(206, 65536, ctypes.addressof(ctx))\n\
         denied(209, 0, 1, 0)"
    );
    let r = attack("py", &code).await;
    assert_eq!(out(&r), "DENIED\nDENIED\n", "{r}");
    assert_healthy().await;
}
