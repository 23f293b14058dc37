//! State that belongs to one process: a forked child gets its own, never its parent's.
//!
//! A handle opened before `fork()` is copied into every child with its idle connections,
//! its background threads' channels and its mutexes. A child that used the parent's
//! sockets would read replies meant for another process (two children each granted the
//! same key), and a mutex some parent thread held at the fork stays locked in the child
//! for good. So everything a handle keeps per connection lives in a [`PerProcess`]: the
//! first use in a new process installs a fresh value, and the parent's copy is leaked in
//! the child (never dropped: its sockets are the parent's, and dropping them would run
//! their destructors on state another process owns).

use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::shm::process;

/// A `T` for the calling process, made on its first use there.
pub(crate) struct PerProcess<T> {
    cur: AtomicPtr<Owned<T>>,
    /// Owns `T`s, made and dropped by any thread: `Send` and `Sync` as `T` allows (an
    /// `AtomicPtr` alone would make it both whatever `T` is).
    _owns: PhantomData<*const T>,
}

// SAFETY: a `PerProcess` owns boxed `T`s: moving it to another thread moves them (T: Send).
unsafe impl<T: Send> Send for PerProcess<T> {}
// SAFETY: shared, it hands out `&T` to every thread (T: Sync), and values made by one
// thread may be dropped by another (T: Send).
unsafe impl<T: Send + Sync> Sync for PerProcess<T> {}

struct Owned<T> {
    /// The process that made it (`process::token`, which no forked child shares).
    process: u64,
    value: T,
}

impl<T> PerProcess<T> {
    // (made empty only by the Redis handles and the async watchers)
    #[cfg_attr(not(any(feature = "redis", feature = "tokio")), allow(dead_code))]
    pub(crate) const fn new() -> PerProcess<T> {
        PerProcess {
            cur: AtomicPtr::new(ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// Holding `value` for the calling process already.
    pub(crate) fn with(value: T) -> PerProcess<T> {
        let owned = Box::new(Owned {
            process: process::token(),
            value,
        });
        PerProcess {
            cur: AtomicPtr::new(Box::into_raw(owned)),
            _owns: PhantomData,
        }
    }

    /// This process's value, if it has made one (none in a forked child before its first
    /// use there).
    pub(crate) fn get_mut(&mut self) -> Option<&mut T> {
        let p = *self.cur.get_mut();
        // SAFETY: `&mut self`: no reference handed out by `get` is alive, and a non-null
        // `cur` points to a live box (see `get`).
        let owned = unsafe { p.as_mut() }?;
        (owned.process == process::token()).then_some(&mut owned.value)
    }

    /// This process's value, made by `make` if there is none yet.
    pub(crate) fn get(&self, make: impl Fn() -> T) -> &T {
        let me = process::token();
        loop {
            let p = self.cur.load(Ordering::Acquire);
            // SAFETY: a non-null `cur` points to a box that is freed only by `drop` (which
            // has `&mut self`, so no reference from here is alive) or by the thread that
            // made it and lost the race below (before anyone else could see it).
            if let Some(owned) = unsafe { p.as_ref() } {
                if owned.process == me {
                    return &owned.value;
                }
            }
            // None yet, or the parent's: this process's own replaces it. The parent's is
            // leaked here (see the module's docs).
            let fresh = Box::into_raw(Box::new(Owned {
                process: me,
                value: make(),
            }));
            match self
                .cur
                .compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // SAFETY: `fresh` was just installed and is freed only by `drop`.
                Ok(_) => return &unsafe { &*fresh }.value,
                // SAFETY: another thread installed its own first; `fresh` was never shared.
                Err(_) => drop(unsafe { Box::from_raw(fresh) }),
            }
        }
    }
}

/// A value made once for the whole process image (and inherited by forked children), with
/// no lock: racing threads each make one and all but the first drop theirs. Unlike a
/// `OnceLock`, nobody ever waits, so a child forked while a thread of its parent was making
/// the value (a thread the child does not have) never waits for it.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct MadeOnce<T> {
    cur: AtomicPtr<T>,
    /// As [`PerProcess`]'s.
    _owns: PhantomData<*const T>,
}

// SAFETY: as `PerProcess`: it owns a boxed `T`.
unsafe impl<T: Send> Send for MadeOnce<T> {}
// SAFETY: it hands out `&T` to every thread, and a `T` made by one thread may be dropped
// by another (the loser of the race drops its own; the first is never dropped).
unsafe impl<T: Send + Sync> Sync for MadeOnce<T> {}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl<T> MadeOnce<T> {
    pub(crate) const fn new() -> MadeOnce<T> {
        MadeOnce {
            cur: AtomicPtr::new(ptr::null_mut()),
            _owns: PhantomData,
        }
    }

    /// The value, made by `make` if there is none yet. The value lives as long as the
    /// process (a static's is never freed).
    pub(crate) fn get(&'static self, make: impl FnOnce() -> T) -> &'static T {
        let p = self.cur.load(Ordering::Acquire);
        // SAFETY: a non-null `cur` points to a box installed below and never freed.
        if let Some(v) = unsafe { p.as_ref() } {
            return v;
        }
        let fresh = Box::into_raw(Box::new(make()));
        match self
            .cur
            .compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: installed, never freed.
            Ok(_) => unsafe { &*fresh },
            Err(first) => {
                // SAFETY: `fresh` was never shared; `first` was installed by another
                // thread and is never freed.
                drop(unsafe { Box::from_raw(fresh) });
                unsafe { &*first }
            }
        }
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let p = *self.cur.get_mut();
        if p.is_null() {
            return;
        }
        // SAFETY: `&mut self`: no reference handed out by `get` is alive, and the box was
        // made by `Box::into_raw`.
        let owned = unsafe { Box::from_raw(p) };
        if owned.process != process::token() {
            std::mem::forget(owned); // the parent's, in a forked child: leaked
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn one_value_per_process_and_dropped_with_it() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct Counted(u32);
        impl Drop for Counted {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::SeqCst);
            }
        }
        let p = PerProcess::new();
        let made = AtomicUsize::new(0);
        let make = || Counted(made.fetch_add(1, Ordering::SeqCst) as u32);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| assert_eq!(p.get(make).0, p.get(make).0));
            }
        });
        let first = p.get(make).0;
        assert_eq!(p.get(make).0, first);
        // the threads' races may have made (and dropped) more, but one stays
        let before = DROPS.load(Ordering::SeqCst);
        drop(p);
        assert_eq!(DROPS.load(Ordering::SeqCst), before + 1);
    }

    #[test]
    fn made_once_keeps_the_first_value_made() {
        static CELL: MadeOnce<usize> = MadeOnce::new();
        let firsts: Vec<usize> = std::thread::scope(|s| {
            let hs: Vec<_> = (1..=4).map(|i| s.spawn(move || *CELL.get(|| i))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(firsts.iter().all(|&f| f == firsts[0]), "{firsts:?}");
        assert_eq!(*CELL.get(|| 99), firsts[0]);
    }

    #[test]
    fn a_value_given_is_this_processs() {
        let mut p = PerProcess::with(7);
        assert_eq!(*p.get(|| 0), 7, "given, so not made again");
        *p.get_mut().unwrap() += 1;
        assert_eq!(*p.get(|| 0), 8);
    }
}
