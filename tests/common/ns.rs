//! Mount namespaces for the root-only tests: a private one, and a boot id file that reads
//! another boot's id in it.
#![allow(dead_code)]

use super::cstr;

/// Where the kernel shows this boot's id.
pub const BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";

/// Moves the calling (single-threaded, forked) process into a private mount namespace.
pub fn private_mount_ns() {
    // SAFETY: plain system calls on C strings we own.
    unsafe {
        assert_eq!(libc::unshare(libc::CLONE_NEWNS), 0);
        assert_eq!(
            libc::mount(
                std::ptr::null(),
                cstr("/").as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null()
            ),
            0
        );
    }
}

/// Bind-mounts the file `source` over `target` (in a private mount namespace).
pub fn bind(source: &str, target: &str) {
    // SAFETY: bind-mounting a file we own, with C strings that outlive the call.
    unsafe {
        assert_eq!(
            libc::mount(
                cstr(source).as_ptr(),
                cstr(target).as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null()
            ),
            0
        );
    }
}
