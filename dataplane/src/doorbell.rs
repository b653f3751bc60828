//! A doorbell a sleeping worker waits on, rung by the threads that queue work for it: its
//! control queue (other threads' requests) and, on an RNIC over several workers, the queues
//! between them (frames steered or handed to it).
//!
//! The sleeper arms the bell, then looks at its queues one last time, then waits on the
//! bell's word for the value it saw; a producer queues its work, then rings. The two fences
//! (store-load ordering on both sides) make sure that work queued after the sleeper's last
//! look finds the bell armed, so a sleep never outlasts the work it missed: the futex wait
//! returns at once if the word moved since it was read.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};

use ferroce_host::abi::ring::WaitWord;

/// A futex word of this process and whether its owner is (about to be) asleep on it.
#[derive(Debug, Default)]
pub struct Doorbell {
    /// Bumped by every ring that finds the bell armed.
    seq: AtomicU32,
    armed: AtomicBool,
}

impl Doorbell {
    /// The sleeper, before its last look at its queues: arms the bell and returns the word
    /// to wait on (valid while the bell lives).
    pub fn arm(&self) -> WaitWord {
        self.armed.store(true, Ordering::Relaxed);
        // Store-load ordering with `ring`: the look at the queues comes after the arm.
        fence(Ordering::SeqCst);
        WaitWord::private(&self.seq, self.seq.load(Ordering::Acquire))
    }

    /// The sleeper, awake again (or not going to sleep after all). Only reads the flag when
    /// it is already clear, so a busy owner that calls it every iteration does not take the
    /// line away from its producers.
    pub fn disarm(&self) {
        if self.armed.load(Ordering::Relaxed) {
            self.armed.store(false, Ordering::Relaxed);
        }
    }

    /// A producer, after queuing work: wakes the owner if it is (about to be) asleep. Costs
    /// a fence and a load when it is not.
    pub fn ring(&self) {
        // Store-load ordering with `arm`: the queued work is visible before the look at
        // `armed`.
        fence(Ordering::SeqCst);
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::AcqRel) {
            self.wake();
        }
    }

    /// Ends the owner's sleep whether or not it is armed (e.g. so it sees a stop flag).
    pub fn wake(&self) {
        self.seq.fetch_add(1, Ordering::Release);
        // SAFETY: FUTEX_WAKE_PRIVATE on a word of this live struct; it never blocks.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.seq.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// A sleeper that armed the bell before a producer rang wakes at once, long before its
    /// timeout; a ring that finds the bell disarmed wakes nobody.
    #[test]
    fn a_ring_after_the_arm_ends_the_sleep() {
        let bell = Arc::new(Doorbell::default());
        let b = bell.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            let w = b.arm();
            tx.send(()).unwrap();
            let t = Instant::now();
            ferroce_host::abi::ring::wait_any(&[w], Duration::from_secs(5));
            b.disarm();
            t.elapsed()
        });
        rx.recv().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        bell.ring();
        let slept = sleeper.join().unwrap();
        assert!(slept < Duration::from_millis(2500), "slept {slept:?}");
        // Disarmed: a ring changes nothing.
        let before = bell.seq.load(Ordering::Relaxed);
        bell.ring();
        assert_eq!(bell.seq.load(Ordering::Relaxed), before);
    }
}
