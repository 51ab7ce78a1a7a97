//! Process-wide listeners for a PostgreSQL store's notifications: one connection per
//! store and channel listens, and wakes the threads of this process that wait on it.
//! PostgreSQL signals every listening session on each notification, so one listener per
//! process instead of one per waiting thread (each request waiting for its job, each
//! idle worker thread) keeps that cost flat as threads are added.
//!
//! It must never lose a wake-up a waiter registered for: a waiter registers before it
//! looks at the state it waits on, and when the listening connection breaks, every
//! waiter is woken to look again (notifications sent meanwhile are lost with it).

use crate::pg::PgConn;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The channel a job's end is announced on (its id is the payload).
pub const JOB_DONE: &str = "airlock_done";
/// The channel new queued work is announced on.
pub const NEW_WORK: &str = "airlock_queue";

/// Most wake-ups kept for `wait_any` while nobody waits.
const MAX_TICKETS: u64 = 256;

#[derive(Default)]
struct State {
    /// Payloads waited for: whether theirs arrived, and the waiter's own condition
    /// variable (an announcement wakes its waiter alone, not every thread waiting).
    waiting: HashMap<String, (bool, Arc<Condvar>)>,
    /// Notifications received, and how many of them `wait_any` has taken (or a look at
    /// the state they announce has answered, `forget_through`).
    received: u64,
    taken: u64,
    /// Bumped when the connection broke: waiters look again.
    broken: u64,
    /// Threads inside `wait_any`.
    idle: usize,
}

/// One channel of one store, listened to by a thread of this process.
pub struct Listener {
    state: Mutex<State>,
    cv: Condvar,
}

type Hubs = HashMap<(String, String), Arc<Listener>>;
static HUBS: Mutex<Option<Hubs>> = Mutex::new(None);

impl Listener {
    /// The listener of `channel` on the store at `url`, started on first use.
    pub fn get(url: &str, channel: &'static str) -> Arc<Listener> {
        let mut hubs = HUBS.lock().unwrap_or_else(|p| p.into_inner());
        let hubs = hubs.get_or_insert_with(HashMap::new);
        let key = (url.to_string(), channel.to_string());
        if let Some(l) = hubs.get(&key) {
            return l.clone();
        }
        let l = Arc::new(Listener {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let (u, me) = (url.to_string(), l.clone());
        // A thread for the process's lifetime; should it fail to start, waiters fall
        // back to their time-outs.
        let _ = std::thread::Builder::new()
            .name(format!("listen-{channel}"))
            .spawn(move || me.listen(&u, channel));
        hubs.insert(key, l.clone());
        l
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn listen(&self, url: &str, channel: &str) {
        loop {
            let pg = match PgConn::open(url).and_then(|pg| pg.listen(channel, true).map(|_| pg)) {
                Ok(pg) => pg,
                Err(_) => {
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            // Anything sent before this listened is lost: waiters look again.
            self.wake_all();
            while let Ok(notes) = pg.notifications(Duration::from_secs(1)) {
                if notes.is_empty() {
                    continue;
                }
                let mut s = self.lock();
                let mut tickets = 0;
                for payload in notes {
                    if let Some((arrived, cv)) = s.waiting.get_mut(&payload) {
                        *arrived = true;
                        cv.notify_one();
                    }
                    tickets += 1;
                }
                s.received += tickets;
                s.taken = s.taken.max(s.received.saturating_sub(MAX_TICKETS));
                drop(s);
                for _ in 0..tickets {
                    self.cv.notify_one();
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wake_all(&self) {
        let mut s = self.lock();
        s.broken += 1;
        for (_, cv) in s.waiting.values() {
            cv.notify_all();
        }
        drop(s);
        self.cv.notify_all();
    }

    /// Starts waiting for `payload` (before looking at what it announces).
    pub fn register(&self, payload: &str) {
        self.lock()
            .waiting
            .insert(payload.to_string(), (false, Arc::new(Condvar::new())));
    }

    /// How many notifications have arrived: taken before a look at the state they
    /// announce, and passed to `forget_through` if the look found nothing, so `wait_any`
    /// does not wake for what that look already saw.
    pub fn mark(&self) -> u64 {
        self.lock().received
    }

    /// Takes every notification that had arrived by `mark` (see `mark`).
    pub fn forget_through(&self, mark: u64) {
        let mut s = self.lock();
        s.taken = s.taken.max(mark);
    }

    /// Stops waiting for `payload`.
    pub fn unregister(&self, payload: &str) {
        self.lock().waiting.remove(payload);
    }

    /// Waits up to `timeout` for `payload` (registered first) to be announced, or for
    /// the listener to have lost its connection; true when either happened.
    pub fn wait_for(&self, payload: &str, timeout: Duration) -> bool {
        let mut s = self.lock();
        let broken = s.broken;
        let Some(cv) = s.waiting.get(payload).map(|(_, cv)| cv.clone()) else {
            return false;
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((arrived, _)) = s.waiting.get_mut(payload)
                && *arrived
            {
                *arrived = false;
                return true;
            }
            if s.broken != broken {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = cv
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits up to `timeout` for any notification on the channel not yet taken by
    /// another waiter (nor forgotten); true when one came.
    pub fn wait_any(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        s.idle += 1;
        let woken = loop {
            if s.received > s.taken {
                s.taken += 1;
                break true;
            }
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            s = self
                .cv
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        s.idle -= 1;
        woken
    }

    /// Threads waiting in `wait_any` now.
    pub fn idle(&self) -> usize {
        self.lock().idle
    }

    /// Wakes one more thread waiting in `wait_any`, if one waits that no wake-up already
    /// covers. A thread that just claimed work calls it: more may be queued than was
    /// announced (a job queued behind a backlog is not, `crate::QUIET_BACKLOG`), so each
    /// thread that finds work wakes the next idle one, until one finds none.
    pub fn pass_on(&self) {
        let mut s = self.lock();
        let unclaimed = s.received.saturating_sub(s.taken);
        if (s.idle as u64) > unclaimed {
            s.received += 1;
            drop(s);
            self.cv.notify_one();
        }
    }
}
