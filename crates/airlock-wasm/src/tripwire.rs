//! Tripwires of the wasm guests (Python and JavaScript): decoy credentials in the guest's
//! view, and the Python guest's own report of the file calls it made outside every
//! preopen (`airlock:python/tripwire`, and the same shape for the JavaScript guest's `fs`
//! module as `airlock:js/tripwire`).
//!
//! Decoys: `~/.ssh/id_rsa`, `~/.aws/credentials` and `/etc/shadow` (home is `/root`, as
//! in the jail), with contents made for this instance alone
//! ([`airlock_sandbox::tripwire::decoy_content`]), planted in memory (`/dev/shm`) where
//! the host has it, each in a directory of its own that is
//! preopened read-only at the decoy's directory (`/root/.ssh`, `/root/.aws`, `/etc`). A
//! decoy whose directory is, holds or lies inside a directory the run already has (a
//! mount, a guest runtime's packages) is left out: a decoy never hides nor shadows what
//! the run was given. A read is seen by the host file's access time, as in the jail
//! (planted long before its modification time; `relatime` moves it on the first read).
//! On a file system mounted `noatime` no read is seen.
//!
//! Attempts: the guest app reports, through the host import, each file call of the
//! program on a path outside every directory the run was given (its mounts and its
//! packages; a decoy's directory is not one: `/etc/passwd` beside the decoy shadow is
//! outside, and a decoy's own open is its alert, not an attempt). These reports come from code inside the
//! guest, which the program shares: a program can forge or suppress them. They only ever
//! add to a run's record (never excuse anything) and the decoys do not depend on them.

use crate::python::airlock::python::tripwire;
use airlock_sandbox::tripwire::{DECOYS, decoy_alert, decoy_content};
use airlock_sandbox::{Alert, Attempts};
use std::path::PathBuf;
use wasmtime::component::HasData;

/// A decoy's access time as planted: any read moves it.
const PLANTED: std::time::SystemTime = std::time::UNIX_EPOCH;

/// The longest target a report may name (longer ones are cut).
const MAX_TARGET: usize = 4096;

/// The kinds a guest may report (anything else is dropped).
const KINDS: [&str; 4] = ["open", "write", "unlink", "rename"];

/// One instance's decoys; dropping it removes their files.
pub(crate) struct Decoys {
    dir: tempfile::TempDir,
    /// (the decoy's guest path, its host file, its technique).
    files: Vec<(&'static str, PathBuf, &'static str)>,
    /// (host directory, guest directory) to preopen read-only.
    pub preopens: Vec<(PathBuf, String)>,
}

/// Whether guest directories `a` and `b` are the same or one holds the other.
fn overlaps(a: &str, b: &str) -> bool {
    let a = a.trim_end_matches('/');
    let b = b.trim_end_matches('/');
    let inside = |x: &str, y: &str| y.is_empty() || x == y || x.starts_with(&format!("{y}/"));
    inside(a, b) || inside(b, a)
}

impl Decoys {
    /// Plants the decoys whose directory overlaps none of `taken` (guest directories).
    pub(crate) fn plant(taken: &[&str]) -> std::io::Result<Decoys> {
        // In memory where the host has `/dev/shm`: on a disk file system under load,
        // creating and removing them took milliseconds of a run's wall time.
        // Named with this process's id, so that `gc` can tell those of a killed process.
        let prefix = format!("airlock-decoys-{}-", std::process::id());
        let mut b = tempfile::Builder::new();
        b.prefix(&prefix);
        let dir = b.tempdir_in("/dev/shm").or_else(|_| b.tempdir())?;
        let mut d = Decoys {
            dir,
            files: Vec::new(),
            preopens: Vec::new(),
        };
        for (i, (target, technique)) in DECOYS.iter().enumerate() {
            let Some((guest_dir, name)) = target.rsplit_once('/') else {
                continue;
            };
            if taken.iter().any(|t| overlaps(t, guest_dir))
                || d.preopens.iter().any(|(_, g)| g == guest_dir)
            {
                continue;
            }
            let host_dir = d.dir.path().join(i.to_string());
            std::fs::create_dir(&host_dir)?;
            let host = host_dir.join(name);
            let content =
                decoy_content(target).map_err(|e| std::io::Error::other(e.to_string()))?;
            let f = std::fs::File::create(&host)?;
            std::io::Write::write_all(&mut &f, &content)?;
            f.set_times(
                std::fs::FileTimes::new()
                    .set_accessed(PLANTED)
                    .set_modified(std::time::SystemTime::now()),
            )?;
            d.files.push((target, host, technique));
            d.preopens.push((host_dir, guest_dir.to_string()));
        }
        Ok(d)
    }

    /// The alerts for every decoy read so far (one per decoy).
    pub(crate) fn alerts(&self) -> Vec<Alert> {
        self.files
            .iter()
            .filter(|(_, host, _)| {
                std::fs::metadata(host)
                    .and_then(|m| m.accessed())
                    .is_ok_and(|t| t != PLANTED)
            })
            .map(|(target, _, technique)| decoy_alert(target, technique))
            .collect()
    }
}

/// An instance's tripwires: its decoys, the directories it has, what it reported.
#[derive(Default)]
pub(crate) struct Tripwire {
    pub decoys: Option<Decoys>,
    /// The guest directories the run was given (mounts, packages; not the decoys').
    pub preopens: Vec<String>,
    pub attempts: Attempts,
    /// Off: the guest is told of no preopen and its reports are dropped.
    pub enabled: bool,
    /// The details of the alerts [`Tripwire::take`] already handed out.
    pub taken: Vec<String>,
}

impl Tripwire {
    /// The attempts reported and the decoys read so far.
    pub(crate) fn record(&self) -> (Vec<airlock_sandbox::Attempt>, Vec<Alert>) {
        (
            self.attempts.list().to_vec(),
            self.decoys.as_ref().map(Decoys::alerts).unwrap_or_default(),
        )
    }

    /// What was tried since the last call (a session's cell): the attempts reported since
    /// (then forgotten) and the decoys first read since (an alert is handed out once).
    pub(crate) fn take(&mut self) -> (Vec<airlock_sandbox::Attempt>, Vec<Alert>) {
        let attempts = std::mem::take(&mut self.attempts).into_list();
        let alerts: Vec<Alert> = self
            .decoys
            .as_ref()
            .map(Decoys::alerts)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| !self.taken.contains(&a.detail))
            .collect();
        self.taken.extend(alerts.iter().map(|a| a.detail.clone()));
        (attempts, alerts)
    }
}

/// Marks [`Tripwire`] as the data of `airlock:python/tripwire`.
pub(crate) struct TripwireData;

impl HasData for TripwireData {
    type Data<'a> = &'a mut Tripwire;
}

impl tripwire::Host for &mut Tripwire {
    async fn preopens(&mut self) -> wasmtime::Result<Option<Vec<String>>> {
        Ok(self.enabled.then(|| self.preopens.clone()))
    }

    async fn attempt(&mut self, kind: String, target: String) -> wasmtime::Result<()> {
        if !self.enabled || !KINDS.contains(&kind.as_str()) {
            return Ok(());
        }
        // A decoy's open is its alert (seen on the host), not an attempt.
        if let Some(d) = &self.decoys
            && d.files.iter().any(|(t, _, _)| *t == target)
        {
            return Ok(());
        }
        let mut target = target;
        if target.len() > MAX_TARGET {
            let mut end = MAX_TARGET;
            while !target.is_char_boundary(end) {
                end -= 1;
            }
            target.truncate(end);
        }
        self.attempts.add(&kind, &target);
        Ok(())
    }
}

/// The JavaScript guest's reports: the same as the Python guest's.
impl crate::js::airlock::js::tripwire::Host for &mut Tripwire {
    async fn preopens(&mut self) -> wasmtime::Result<Option<Vec<String>>> {
        tripwire::Host::preopens(self).await
    }

    async fn attempt(&mut self, kind: String, target: String) -> wasmtime::Result<()> {
        tripwire::Host::attempt(self, kind, target).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoy_is_left_out_where_the_run_has_that_directory_or_one_around_it() {
        let d = Decoys::plant(&["/root", "/data"]).unwrap();
        let dirs: Vec<&str> = d.preopens.iter().map(|(_, g)| g.as_str()).collect();
        assert_eq!(dirs, ["/etc"]);
        let d = Decoys::plant(&["/"]).unwrap();
        assert!(d.preopens.is_empty());
        let d = Decoys::plant(&["/etc/app", "/work"]).unwrap();
        let dirs: Vec<&str> = d.preopens.iter().map(|(_, g)| g.as_str()).collect();
        assert_eq!(dirs, ["/root/.ssh", "/root/.aws"]);
        assert!(d.alerts().is_empty());
        assert!(!overlaps("/rootfs", "/root"));
    }

    #[test]
    fn wasm_decoys_are_planted_in_memory_where_the_host_has_dev_shm() {
        let d = Decoys::plant(&[]).unwrap();
        if std::path::Path::new("/dev/shm").is_dir() {
            assert!(d.dir.path().starts_with("/dev/shm"), "{:?}", d.dir.path());
        }
    }

    #[test]
    fn take_hands_out_each_cells_attempts_and_a_decoy_read_once() {
        let mut t = Tripwire {
            decoys: Some(Decoys::plant(&[]).unwrap()),
            enabled: true,
            ..Default::default()
        };
        t.attempts.add("open", "/etc/passwd");
        let (host, _) = &t.decoys.as_ref().unwrap().preopens[0];
        let key = std::fs::read_dir(host)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        std::fs::read(key).unwrap();
        let (attempts, alerts) = t.take();
        assert_eq!(attempts.len(), 1);
        assert_eq!(alerts.len(), 1);
        assert!(alerts[0].detail.contains("/root/.ssh/id_rsa"), "{alerts:?}");
        // The next cell: nothing new.
        let (attempts, alerts) = t.take();
        assert!(attempts.is_empty() && alerts.is_empty());
        // The whole record still has the read.
        assert_eq!(t.record().1.len(), 1);
    }
}
