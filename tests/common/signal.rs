//! Signals to the test's own processes. `kill(2)` with a pid of 0 or less signals a whole
//! process group (0: the test's own, which holds the harness and CI's shell; -1: every
//! process the caller may signal), so a test that read a child's pid before the child
//! wrote it would end the whole run. These refuse such a pid with a panic that says so.

/// Sends `sig` to the one process `pid` (> 0); returns what `kill(2)` returned.
pub fn send(pid: libc::pid_t, sig: libc::c_int) -> libc::c_int {
    assert!(
        pid > 0,
        "refusing to send signal {sig} to pid {pid}: it would reach a whole process group"
    );
    // SAFETY: kill(2) touches no memory of ours; `pid` names one process.
    unsafe { libc::kill(pid, sig) }
}

/// Sends `sig` to the process group `pgid` (> 1, and not the test's own group).
pub fn send_group(pgid: libc::pid_t, sig: libc::c_int) -> libc::c_int {
    // SAFETY: getpgrp has no preconditions.
    let own = unsafe { libc::getpgrp() };
    assert!(
        pgid > 1 && pgid != own,
        "refusing to send signal {sig} to process group {pgid} (the test's own is {own})"
    );
    // SAFETY: kill(2) touches no memory of ours; `-pgid` names one group of the test's.
    unsafe { libc::kill(-pgid, sig) }
}
