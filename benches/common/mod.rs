//! Baselines and process plumbing shared by the benches.
#![allow(dead_code)]

use std::ffi::CString;
use std::path::Path;
use std::sync::atomic::AtomicU64;

/// A process-shared robust `pthread_mutex_t` in a shared anonymous mapping: the kernel's
/// own crash-safe inter-process lock. Forked children share it.
pub struct RobustMutex {
    ptr: *mut libc::pthread_mutex_t,
}

impl RobustMutex {
    pub fn new() -> RobustMutex {
        let m = shared_anon(std::mem::size_of::<libc::pthread_mutex_t>()).cast();
        // SAFETY: `m` is fresh, writable, large enough and aligned (page-aligned); it is
        // initialised in place with process-shared, robust attributes before any use.
        unsafe {
            let mut attr = std::mem::zeroed::<libc::pthread_mutexattr_t>();
            libc::pthread_mutexattr_init(&mut attr);
            libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
            assert_eq!(libc::pthread_mutex_init(m, &attr), 0);
        }
        RobustMutex { ptr: m }
    }

    pub fn lock(&self) {
        // SAFETY: an initialised mutex in a mapping that is never unmapped.
        let rc = unsafe { libc::pthread_mutex_lock(self.ptr) };
        if rc == libc::EOWNERDEAD {
            // SAFETY: we own it now; mark it consistent so it stays usable.
            unsafe { libc::pthread_mutex_consistent(self.ptr) };
        }
    }

    pub fn unlock(&self) {
        // SAFETY: held by this thread (locked just before).
        unsafe { libc::pthread_mutex_unlock(self.ptr) };
    }
}

/// A process-shared `pthread_rwlock_t` in a shared anonymous mapping (glibc's default
/// kind: readers first). Forked children share it. No holder's death is ever recovered.
pub struct RwLock {
    ptr: *mut libc::pthread_rwlock_t,
}

impl RwLock {
    pub fn new() -> RwLock {
        let l = shared_anon(std::mem::size_of::<libc::pthread_rwlock_t>()).cast();
        // SAFETY: `l` is fresh, writable, large enough and page-aligned; it is initialised
        // in place with the process-shared attribute before any use.
        unsafe {
            let mut attr = std::mem::zeroed::<libc::pthread_rwlockattr_t>();
            libc::pthread_rwlockattr_init(&mut attr);
            libc::pthread_rwlockattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
            assert_eq!(libc::pthread_rwlock_init(l, &attr), 0);
        }
        RwLock { ptr: l }
    }

    pub fn read(&self) {
        // SAFETY: an initialised lock in a mapping that is never unmapped.
        assert_eq!(unsafe { libc::pthread_rwlock_rdlock(self.ptr) }, 0);
    }

    pub fn write(&self) {
        // SAFETY: as in `read`.
        assert_eq!(unsafe { libc::pthread_rwlock_wrlock(self.ptr) }, 0);
    }

    pub fn unlock(&self) {
        // SAFETY: held by this thread (taken just before).
        unsafe { libc::pthread_rwlock_unlock(self.ptr) };
    }
}

/// A POSIX named semaphore (`sem_open`), unlinked at once: forked children share it. A
/// holder killed before its `sem_post` takes its unit with it for good.
pub struct NamedSemaphore {
    sem: *mut libc::sem_t,
}

impl NamedSemaphore {
    pub fn new(value: u32) -> NamedSemaphore {
        let name = CString::new(format!("/shmlock-bench-{}", std::process::id())).unwrap();
        // SAFETY: a valid name; the result is checked.
        let sem =
            unsafe { libc::sem_open(name.as_ptr(), libc::O_CREAT | libc::O_EXCL, 0o600, value) };
        assert_ne!(
            sem,
            libc::SEM_FAILED,
            "sem_open: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: the name just created; the mapping stays.
        unsafe { libc::sem_unlink(name.as_ptr()) };
        NamedSemaphore { sem }
    }

    pub fn wait(&self) {
        // SAFETY: an open semaphore.
        while unsafe { libc::sem_wait(self.sem) } != 0 {}
    }

    pub fn post(&self) {
        // SAFETY: an open semaphore.
        unsafe { libc::sem_post(self.sem) };
    }
}

/// `flock(2)` on a descriptor of its own (open it after `fork`: a shared open file
/// description would share the lock).
pub struct Flock {
    fd: libc::c_int,
}

impl Flock {
    pub fn open(path: &Path) -> Flock {
        Flock { fd: open_rw(path) }
    }

    pub fn lock(&self) {
        // SAFETY: a valid descriptor.
        unsafe { libc::flock(self.fd, libc::LOCK_EX) };
    }

    pub fn unlock(&self) {
        // SAFETY: a valid descriptor.
        unsafe { libc::flock(self.fd, libc::LOCK_UN) };
    }
}

impl Drop for Flock {
    fn drop(&mut self) {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// Opens (creating) a file read-write and returns the raw descriptor.
pub fn open_rw(path: &Path) -> libc::c_int {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
            0o600,
        )
    };
    assert!(
        fd >= 0,
        "open {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    fd
}

/// Lock by opening a per-key file, `flock`ing it and closing it again (the lockfile idiom).
pub fn open_flock_close(path: &Path) {
    let fd = open_rw(path);
    // SAFETY: a valid descriptor; closing it releases the lock.
    unsafe {
        libc::flock(fd, libc::LOCK_EX);
        libc::close(fd);
    }
}

/// A zeroed shared anonymous mapping of `len` bytes, inherited by forked children, never
/// unmapped.
pub fn shared_anon(len: usize) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len.max(1),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

/// `n` shared counters.
pub fn shared_words(n: usize) -> &'static [AtomicU64] {
    let p = shared_anon(n * 8).cast::<AtomicU64>();
    // SAFETY: zeroed, aligned, `n * 8` bytes, never unmapped, only used as atomics.
    unsafe { std::slice::from_raw_parts(p, n) }
}

/// Forks; the child runs `f` and exits.
pub fn fork(f: impl FnOnce()) -> libc::pid_t {
    // SAFETY: the benches are single-threaded when they fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        f();
        // SAFETY: end the child without the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    pid
}

pub fn wait(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed"
    );
}

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A directory for the benches' files: /dev/shm where there is one.
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("shmlock-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
