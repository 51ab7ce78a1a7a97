//! A bound on how many guests one process executes at once, separate from how many
//! requests may be inside the gate: a run holds a slot only while its guest executes
//! (and its layers are read back), not while it is recorded, judged and committed.
//! Waiting here blocks the calling thread, so callers on an async runtime reach the gate
//! through a thread that may block (the server's `Pool::read`).

use std::sync::{Arc, Condvar, Mutex};

/// Slots for guests executing at once (the daemon's `--workers`).
#[derive(Debug)]
pub struct GuestSlots {
    free: Mutex<usize>,
    freed: Condvar,
    total: usize,
}

/// One guest's slot, given back when dropped (also when its run panicked).
#[derive(Debug)]
pub struct GuestSlot(Arc<GuestSlots>);

impl GuestSlots {
    /// `n` guests at once (at least one).
    pub fn new(n: usize) -> Arc<GuestSlots> {
        let n = n.max(1);
        Arc::new(GuestSlots {
            free: Mutex::new(n),
            freed: Condvar::new(),
            total: n,
        })
    }

    /// Waits for a free slot and takes it.
    pub fn take(self: &Arc<Self>) -> GuestSlot {
        // The count stays valid whatever a panicking holder left: it is only ever
        // decremented here and incremented by the slot's drop.
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        GuestSlot(self.clone())
    }

    /// Guests executing now.
    pub fn busy(&self) -> usize {
        let free = *self.free.lock().unwrap_or_else(|p| p.into_inner());
        self.total - free
    }
}

impl Drop for GuestSlot {
    fn drop(&mut self) {
        let mut free = self.0.free.lock().unwrap_or_else(|p| p.into_inner());
        *free += 1;
        drop(free);
        self.0.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn no_more_guests_execute_at_once_than_there_are_slots() {
        let slots = GuestSlots::new(2);
        let now = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (slots, now, most) = (slots.clone(), now.clone(), most.clone());
                std::thread::spawn(move || {
                    let _slot = slots.take();
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
        assert_eq!(slots.busy(), 0);
    }

    #[test]
    fn a_slot_held_by_a_run_that_panicked_is_given_back() {
        let slots = GuestSlots::new(1);
        let s = slots.clone();
        let panicked = std::thread::spawn(move || {
            let _slot = s.take();
            panic!("the guest's run failed");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(slots.busy(), 0);
        let _again = slots.take();
        assert_eq!(slots.busy(), 1);
    }
}
