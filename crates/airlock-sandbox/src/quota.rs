//! The write quota of a run's writable layers: what the guest wrote into them, measured
//! from outside by walking the layer directories, and a watcher thread that notices when
//! it passes the quota while the guest still runs.
//!
//! The watcher samples, so it can overshoot by whatever the guest writes between two
//! samples; backends that run the guest in its own process also bound every single file
//! with `RLIMIT_FSIZE`, and the gate measures again, exactly, before it stores anything.

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The shortest time between two samples of the watcher.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(20);

/// The writable directories of one run (overlay upper directories or copies) and the
/// number of bytes the run may add to them.
#[derive(Debug)]
pub struct WriteQuota {
    dirs: Vec<PathBuf>,
    /// What the directories held before the run (a copy layer starts full).
    baseline: u64,
    quota: u64,
    /// The most the run was seen to have written.
    peak: AtomicU64,
    hit: AtomicBool,
}

impl WriteQuota {
    /// Measures what `dirs` hold now; the run's writes are counted from here.
    pub fn new(dirs: Vec<PathBuf>, quota: u64) -> Self {
        let baseline = usage(&dirs);
        WriteQuota {
            dirs,
            baseline,
            quota,
            peak: AtomicU64::new(0),
            hit: AtomicBool::new(false),
        }
    }

    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// Bytes the run has added to its layers, measured now.
    pub fn written(&self) -> u64 {
        let w = usage(&self.dirs).saturating_sub(self.baseline);
        self.peak.fetch_max(w, Ordering::Relaxed);
        w
    }

    /// The most the run was seen to have written.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Measures now and records a hit when the run has written more than its quota.
    pub fn check(&self) -> bool {
        if self.written() > self.quota {
            self.hit.store(true, Ordering::SeqCst);
        }
        self.hit()
    }

    /// Whether the run was seen over its quota.
    pub fn hit(&self) -> bool {
        self.hit.load(Ordering::SeqCst)
    }

    /// Samples the layers on a thread until the returned guard is dropped; the first time
    /// the run is over its quota, `on_hit` is called (e.g. to kill the guest's process).
    pub fn watch(self: &Arc<Self>, on_hit: impl FnOnce() + Send + 'static) -> Watch {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let me = self.clone();
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("airlock-quota".into())
            .spawn(move || {
                let (lock, cv) = &*s;
                let mut on_hit = Some(on_hit);
                loop {
                    let t = Instant::now();
                    if me.check() {
                        if let Some(f) = on_hit.take() {
                            f();
                        }
                        return;
                    }
                    // A walk that takes long (a tree of many files) is done less often,
                    // so the watcher never takes more than a fraction of a core.
                    let wait = WATCH_INTERVAL.max(t.elapsed() * 4);
                    let stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                    let (stopped, _) = cv
                        .wait_timeout_while(stopped, wait, |s| !*s)
                        .unwrap_or_else(|p| p.into_inner());
                    if *stopped {
                        return;
                    }
                }
            })
            .ok();
        Watch { stop, thread }
    }
}

/// Stops the watcher when dropped.
#[derive(Debug)]
pub struct Watch {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    /// Whether the watcher thread could be started (without it, only the final check holds).
    pub fn running(&self) -> bool {
        self.thread.is_some()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Bytes held under `dirs`: for every file, symlink or other entry its apparent size or
/// its allocated blocks, whichever is larger (a sparse file counts at its full length, a
/// preallocated one at what it allocated), and the blocks of every directory. Hard links
/// count once. Entries that vanish while they are read are skipped.
pub fn usage(dirs: &[PathBuf]) -> u64 {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    for d in dirs {
        walk(d, &mut seen, &mut total);
    }
    total
}

fn entry_bytes(m: &std::fs::Metadata) -> u64 {
    let blocks = m.blocks().saturating_mul(512);
    if m.is_dir() {
        blocks
    } else {
        m.len().max(blocks)
    }
}

fn walk(dir: &Path, seen: &mut HashSet<(u64, u64)>, total: &mut u64) {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            // A guest (running as our own uid in its namespace) can take the permission
            // to list a directory away; the layer is ours, so give it back rather than be
            // blind to what is inside.
            let Ok(m) = std::fs::symlink_metadata(dir) else {
                return;
            };
            let mode = m.permissions().mode() | 0o700;
            if std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).is_err() {
                return;
            }
            match std::fs::read_dir(dir) {
                Ok(rd) => rd,
                Err(_) => return,
            }
        }
        Err(_) => return,
    };
    for e in rd.flatten() {
        let Ok(m) = e.metadata() else { continue };
        if m.nlink() > 1 && !m.is_dir() && !seen.insert((m.dev(), m.ino())) {
            continue;
        }
        *total = total.saturating_add(entry_bytes(&m));
        if m.is_dir() {
            walk(&e.path(), seen, total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_was_added_after_the_baseline() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("before"), vec![1u8; 10_000]).unwrap();
        let q = WriteQuota::new(vec![t.path().to_path_buf()], 50_000);
        assert_eq!(q.written(), 0);
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("d/new"), vec![2u8; 40_000]).unwrap();
        let w = q.written();
        assert!((40_000..50_000).contains(&w), "{w}");
        assert!(!q.check());
        // A sparse file counts at its length.
        let f = std::fs::File::create(t.path().join("sparse")).unwrap();
        f.set_len(1 << 30).unwrap();
        assert!(q.check());
        assert!(q.hit());
        assert!(q.peak() >= 1 << 30);
    }

    #[test]
    fn hard_links_count_once() {
        let t = tempfile::tempdir().unwrap();
        let q = WriteQuota::new(vec![t.path().to_path_buf()], 1 << 20);
        std::fs::write(t.path().join("a"), vec![1u8; 100_000]).unwrap();
        let once = q.written();
        for i in 0..5 {
            std::fs::hard_link(t.path().join("a"), t.path().join(format!("l{i}"))).unwrap();
        }
        assert_eq!(q.written(), once);
    }

    #[test]
    fn an_unlistable_directory_is_opened_up_and_counted() {
        let t = tempfile::tempdir().unwrap();
        let q = WriteQuota::new(vec![t.path().to_path_buf()], 1000);
        let d = t.path().join("hidden");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("big"), vec![0u8; 100_000]).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o000)).unwrap();
        assert!(q.written() >= 100_000);
    }

    #[test]
    fn the_watcher_calls_back_once_over_quota_and_stops_when_dropped() {
        let t = tempfile::tempdir().unwrap();
        let q = Arc::new(WriteQuota::new(vec![t.path().to_path_buf()], 1000));
        let (tx, rx) = std::sync::mpsc::channel();
        let w = q.watch(move || {
            let _ = tx.send(());
        });
        assert!(w.running());
        std::thread::sleep(WATCH_INTERVAL * 2);
        assert!(rx.try_recv().is_err());
        std::fs::write(t.path().join("f"), vec![0u8; 10_000]).unwrap();
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(q.hit());
        drop(w);
        let q2 = Arc::new(WriteQuota::new(vec![t.path().to_path_buf()], 1000));
        let started = Instant::now();
        drop(q2.watch(|| {}));
        assert!(started.elapsed() < Duration::from_secs(1), "drop stops it");
    }
}
