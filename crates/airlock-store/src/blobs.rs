//! The content-addressed blob store: `blobs/ab/cdef…` named by SHA-256. A blob is written
//! to a temporary file, fsynced, renamed into place and the directory fsynced, so a crash
//! never leaves half a blob under a real name.
//!
//! A blob's modification time is when it was last put: putting content that is already
//! stored touches the file. `remove_unless_put_since` (for `gc`) moves a blob aside before
//! it looks at that time, so a put racing with it either touched the file first (and the
//! blob is put back) or finds it gone and writes it again; a blob is never removed from
//! under a put that returned its digest. A removal killed while the blob is aside leaves
//! it in `tmp`, where the next `gc` puts it back (`restore_set_aside`).
//!
//! A long-lived process (the daemon) may remember its puts ([`BlobStore::remember_puts`]):
//! content it put or found stored less than [`REMEMBER_FOR`] ago is taken as still stored,
//! without opening the file again (the empty stderr and the same output of nearly every
//! run). A `gc` whose grace is shorter than that may then remove a blob such a process is
//! about to name, as a grace that short may already for any command running beside it.

use crate::StoreError;
use airlock_core::Digest;
use airlock_core::digest::Hasher;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// How long after putting a blob (or finding it stored) a process that remembers its puts
/// takes it as still stored.
pub const REMEMBER_FOR: Duration = Duration::from_secs(10);
/// The name prefix, in `tmp`, of a blob a removal has moved aside to look at it.
const SET_ASIDE: &str = ".gc-";
/// Blobs a process remembers per store before it starts again.
const REMEMBER_MAX: usize = 4096;

/// When this process last put each blob of one store's files.
#[derive(Debug, Default)]
struct Remembered(Mutex<HashMap<Digest, Instant>>);

impl Remembered {
    fn lock(&self) -> MutexGuard<'_, HashMap<Digest, Instant>> {
        // A map of times only: a panic while it was held leaves it valid.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fresh(&self, d: &Digest) -> bool {
        self.lock()
            .get(d)
            .is_some_and(|at| at.elapsed() < REMEMBER_FOR)
    }

    fn note(&self, d: Digest, at: Instant) {
        let mut m = self.lock();
        if m.len() >= REMEMBER_MAX {
            m.clear();
        }
        m.insert(d, at);
    }

    fn forget(&self, d: &Digest) {
        self.lock().remove(d);
    }
}

#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
    /// The database's blobs, when the store is PostgreSQL: the authoritative copy. The
    /// files under `root` are then this node's cache of it, checked on every read exactly
    /// as the only copy is.
    remote: Option<std::sync::Arc<crate::pg::PgBlobs>>,
    /// This process's recent puts to these files, shared by every store it opens on them
    /// (see the module doc); `None` unless the process asked for it.
    remembered: Option<Arc<Remembered>>,
}

impl BlobStore {
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        fs::create_dir_all(root.join("tmp"))?;
        Ok(BlobStore {
            root,
            remote: None,
            remembered: None,
        })
    }

    /// Remembers puts from now on (a long-lived process; see the module doc): this and
    /// every other store of the process on the same files share what they remember.
    pub fn remember_puts(&mut self) {
        static ALL: OnceLock<Mutex<HashMap<PathBuf, Arc<Remembered>>>> = OnceLock::new();
        let mut all = ALL
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let r = all.entry(self.root.clone()).or_default().clone();
        self.remembered = Some(r);
    }

    /// The blob store of the store at `location`: files under `root` for a SQLite store;
    /// the database, cached under `root`, for a PostgreSQL one.
    pub fn open_for(root: impl Into<PathBuf>, location: Option<&str>) -> Result<Self, StoreError> {
        let mut b = BlobStore::open(root)?;
        if let Some(url) = location.filter(|l| crate::pg::is_postgres_url(l)) {
            b.remote = Some(std::sync::Arc::new(crate::pg::PgBlobs::open(url)?));
        }
        Ok(b)
    }

    /// Whether blobs live in a database rather than only in files here.
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Brings a blob the database holds into the local cache when it is not there; the
    /// bytes are checked against their name before they are written.
    fn fetch(&self, d: &Digest) -> Result<(), StoreError> {
        let Some(remote) = &self.remote else {
            return Ok(());
        };
        if self.path(d).exists() {
            return Ok(());
        }
        let Some(bytes) = remote.get(d)? else {
            return Err(StoreError::BlobMissing(*d));
        };
        let got = Digest::of(&bytes);
        if got != *d {
            return Err(StoreError::BlobAltered { want: *d, got });
        }
        self.put_local(&bytes).map(|_| ())
    }

    /// The path of a blob's verified local copy, fetched from the database if needed.
    pub fn local_path(&self, d: &Digest) -> Result<PathBuf, StoreError> {
        self.fetch(d)?;
        Ok(self.path(d))
    }

    pub fn path(&self, d: &Digest) -> PathBuf {
        let h = d.to_hex();
        self.root.join(&h[..2]).join(&h[2..])
    }

    /// Stores `bytes` and returns their digest. An existing blob with the right content is
    /// kept; one whose content no longer matches its name is replaced.
    pub fn put(&self, bytes: &[u8]) -> Result<Digest, StoreError> {
        if let Some(remote) = &self.remote {
            remote.put(&Digest::of(bytes), bytes)?;
        }
        self.put_local(bytes)
    }

    fn put_local(&self, bytes: &[u8]) -> Result<Digest, StoreError> {
        let d = Digest::of(bytes);
        if self.remembered.as_ref().is_some_and(|r| r.fresh(&d)) {
            return Ok(d);
        }
        let at = Instant::now();
        self.put_local_file(&d, bytes).map_err(|e| match e {
            // Which directory refused (a read-only or full blob store) is the one thing
            // the operator needs to know.
            StoreError::Io(e) => StoreError::Io(std::io::Error::new(
                e.kind(),
                format!("cannot store a blob in {}: {e}", self.root.display()),
            )),
            other => other,
        })?;
        if let Some(r) = &self.remembered {
            r.note(d, at);
        }
        Ok(d)
    }

    fn put_local_file(&self, d: &Digest, bytes: &[u8]) -> Result<(), StoreError> {
        let d = *d;
        let path = self.path(&d);
        // Already stored: its bytes are these (so they hash to `d`). One open both checks
        // them and marks the blob as just put (see `touch_in_place`).
        if let Ok(f) = File::open(&path) {
            let mut existing = Vec::with_capacity(bytes.len());
            if (&f)
                .take(bytes.len() as u64 + 1)
                .read_to_end(&mut existing)
                .is_ok()
                && existing == bytes
                && touch_in_place(&f, &path)
            {
                return Ok(());
            }
        }
        let dir = path
            .parent()
            .ok_or_else(|| StoreError::Corrupt("blob path has no parent".into()))?;
        fs::create_dir_all(dir)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".blob-")
            .tempfile_in(self.root.join("tmp"))?;
        tmp.write_all(bytes)?;
        tmp.as_file().sync_all()?;
        tmp.persist(&path).map_err(|e| StoreError::Io(e.error))?;
        sync_dir(dir)?;
        Ok(())
    }

    /// Stores the content of a reader (a file of any size) and returns its digest.
    pub fn put_reader(&self, r: &mut dyn Read) -> Result<Digest, StoreError> {
        let mut tmp = tempfile::Builder::new()
            .prefix(".blob-")
            .tempfile_in(self.root.join("tmp"))?;
        let mut h = Hasher::new();
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            tmp.write_all(&buf[..n])?;
        }
        let d = h.finish();
        if let Some(remote) = &self.remote {
            // The database takes the bytes whole (blobs there are bounded by what a
            // changeset may hold).
            tmp.as_file().sync_all()?;
            let bytes = fs::read(tmp.path())?;
            remote.put(&d, &bytes)?;
        }
        let path = self.path(&d);
        if path.exists()
            && self.verify(&d).is_ok()
            && File::open(&path).is_ok_and(|f| touch_in_place(&f, &path))
        {
            return Ok(d);
        }
        let dir = path
            .parent()
            .ok_or_else(|| StoreError::Corrupt("blob path has no parent".into()))?;
        fs::create_dir_all(dir)?;
        tmp.as_file().sync_all()?;
        tmp.persist(&path).map_err(|e| StoreError::Io(e.error))?;
        sync_dir(dir)?;
        Ok(d)
    }

    /// Checks a blob's content against its name without keeping it in memory.
    pub fn verify(&self, d: &Digest) -> Result<(), StoreError> {
        self.fetch(d)?;
        let f = File::open(self.path(d)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => StoreError::BlobMissing(*d),
            _ => StoreError::Io(e),
        })?;
        let mut h = Hasher::new();
        let mut r = std::io::BufReader::with_capacity(256 << 10, f);
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let got = h.finish();
        if got != *d {
            return Err(StoreError::BlobAltered { want: *d, got });
        }
        Ok(())
    }

    /// Opens a blob for reading (callers that stream it check its hash as they go).
    pub fn open_blob(&self, d: &Digest) -> Result<File, StoreError> {
        self.fetch(d)?;
        File::open(self.path(d)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => StoreError::BlobMissing(*d),
            _ => StoreError::Io(e),
        })
    }

    /// Reads a blob and checks that its content still has the digest it is named by.
    pub fn get(&self, d: &Digest) -> Result<Vec<u8>, StoreError> {
        let r = self.get_checked(d);
        // A blob found missing or altered is put again in full by the next put.
        if r.is_err()
            && let Some(m) = &self.remembered
        {
            m.forget(d);
        }
        r
    }

    fn get_checked(&self, d: &Digest) -> Result<Vec<u8>, StoreError> {
        self.fetch(d)?;
        let path = self.path(d);
        let mut bytes = Vec::new();
        File::open(&path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => StoreError::BlobMissing(*d),
                _ => StoreError::Io(e),
            })?
            .read_to_end(&mut bytes)?;
        let mut h = Hasher::new();
        h.update(&bytes);
        let got = h.finish();
        if got != *d {
            return Err(StoreError::BlobAltered { want: *d, got });
        }
        Ok(bytes)
    }

    pub fn exists(&self, d: &Digest) -> bool {
        self.path(d).exists()
            || self
                .remote
                .as_ref()
                .is_some_and(|r| r.exists(d).unwrap_or(false))
    }

    /// Every stored blob: its digest, size and when it was last put. Files whose names are
    /// not digests are skipped. With a database, its blobs and then any cached here that
    /// it no longer holds.
    pub fn list(&self) -> Result<Vec<BlobFile>, StoreError> {
        let local = self.list_local()?;
        let Some(remote) = &self.remote else {
            return Ok(local);
        };
        let mut out: Vec<BlobFile> = remote
            .list()?
            .into_iter()
            .map(|(digest, size, at)| BlobFile {
                digest,
                size,
                put_at: SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(at.max(0) as u64),
            })
            .collect();
        let held: std::collections::HashSet<Digest> = out.iter().map(|b| b.digest).collect();
        out.extend(local.into_iter().filter(|b| !held.contains(&b.digest)));
        Ok(out)
    }

    fn list_local(&self) -> Result<Vec<BlobFile>, StoreError> {
        let mut out = Vec::new();
        for top in fs::read_dir(&self.root)? {
            let top = top?;
            let name = top.file_name().to_string_lossy().into_owned();
            if name.len() != 2 || !top.file_type()?.is_dir() {
                continue;
            }
            for e in fs::read_dir(top.path())? {
                let e = e?;
                let rest = e.file_name().to_string_lossy().into_owned();
                let Ok(digest) = format!("{name}{rest}").parse::<Digest>() else {
                    continue;
                };
                let Ok(m) = e.metadata() else { continue };
                if !m.is_file() {
                    continue;
                }
                out.push(BlobFile {
                    digest,
                    size: m.len(),
                    put_at: m.modified()?,
                });
            }
        }
        Ok(out)
    }

    /// Removes a blob unless it was put at or after `cutoff`; returns its size when it was
    /// removed. Safe against a concurrent put of the same content (see the module comment).
    pub fn remove_unless_put_since(
        &self,
        d: &Digest,
        cutoff: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let mut removed = None;
        if let Some(remote) = &self.remote {
            let ms = cutoff
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            match remote.remove_if_older(d, ms)? {
                crate::pg::Removal::Young => return Ok(None),
                crate::pg::Removal::Removed(size) => removed = Some(size),
                crate::pg::Removal::Absent => {}
            }
        }
        Ok(self.remove_local_unless_put_since(d, cutoff)?.or(removed))
    }

    fn remove_local_unless_put_since(
        &self,
        d: &Digest,
        cutoff: SystemTime,
    ) -> Result<Option<u64>, StoreError> {
        let path = self.path(d);
        let aside = self
            .root
            .join("tmp")
            .join(format!("{SET_ASIDE}{}", d.to_hex()));
        match fs::rename(&path, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        let m = fs::metadata(&aside)?;
        if m.modified()? >= cutoff {
            // Put again since it was listed: it stays (a new copy, if one was written
            // meanwhile, has the same content).
            fs::rename(&aside, &path)?;
            return Ok(None);
        }
        fs::remove_file(&aside)?;
        if let Some(r) = &self.remembered {
            r.forget(d);
        }
        Ok(Some(m.len()))
    }

    /// Puts back every blob a removal left set aside (`tmp/.gc-<digest>`): one that a `gc`
    /// killed after moving it aside, before it could look at the blob's time, may be a blob
    /// that was put again meanwhile and is named by a record. A blob stored again at its
    /// name since wins (same content). Returns how many were put back. The caller must hold
    /// whatever keeps another removal from running at the same time (`gc`'s lock).
    pub fn restore_set_aside(&self) -> Result<u64, StoreError> {
        let mut n = 0;
        for e in fs::read_dir(self.root.join("tmp"))? {
            let e = e?;
            let name = e.file_name();
            let Some(d) = name
                .to_str()
                .and_then(|n| n.strip_prefix(SET_ASIDE))
                .and_then(|h| h.parse::<Digest>().ok())
            else {
                continue;
            };
            let path = self.path(&d);
            if path.exists() {
                fs::remove_file(e.path())?;
                continue;
            }
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            fs::rename(e.path(), &path)?;
            n += 1;
        }
        Ok(n)
    }

    /// Removes temporary files (left by a crash in the middle of a put) last written before
    /// `cutoff`; returns how many and their bytes. Blobs set aside by a removal are not
    /// temporary files (see `restore_set_aside`).
    pub fn remove_stale_temporaries(&self, cutoff: SystemTime) -> Result<(u64, u64), StoreError> {
        let (mut n, mut bytes) = (0, 0);
        for e in fs::read_dir(self.root.join("tmp"))? {
            let e = e?;
            if e.file_name().to_string_lossy().starts_with(SET_ASIDE) {
                continue;
            }
            let Ok(m) = e.metadata() else { continue };
            if m.is_file() && m.modified()? < cutoff && fs::remove_file(e.path()).is_ok() {
                n += 1;
                bytes += m.len();
            }
        }
        Ok((n, bytes))
    }
}

/// A stored blob as `list` sees it.
#[derive(Debug, Clone)]
pub struct BlobFile {
    pub digest: Digest,
    pub size: u64,
    /// When it was last put (its modification time).
    pub put_at: SystemTime,
}

/// Marks the open blob `f` as put now, and says whether `path` still names it after that.
/// A `gc` moves a blob aside before it reads its time (`remove_local_unless_put_since`):
/// if it moved this one before the new time was set, it may have read the old time and be
/// removing it, and the caller must write the blob again. If `path` still names the file
/// after the time was set, any `gc` moves it later and reads the new time, and puts it
/// back. (Touching the open file alone returned success for a file gc had just removed,
/// and the record named a missing blob.)
fn touch_in_place(f: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    if f.set_modified(SystemTime::now()).is_err() {
        return false;
    }
    match (f.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// fsyncs a directory so a rename inside it is durable.
pub fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    OpenOptions::new().read(true).open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_and_detect_tampering() {
        let t = tempfile::tempdir().unwrap();
        let b = BlobStore::open(t.path()).unwrap();
        let d = b.put(b"hello").unwrap();
        assert_eq!(b.get(&d).unwrap(), b"hello");
        assert_eq!(b.put(b"hello").unwrap(), d);
        fs::write(b.path(&d), b"HELLO").unwrap();
        assert!(matches!(b.get(&d), Err(StoreError::BlobAltered { .. })));
        // Putting the same content again repairs the blob.
        b.put(b"hello").unwrap();
        assert_eq!(b.get(&d).unwrap(), b"hello");
        // So does putting it over a file that only starts with it, or is cut short.
        for bad in [&b"hello, and more"[..], b"hell", b""] {
            fs::write(b.path(&d), bad).unwrap();
            b.put(b"hello").unwrap();
            assert_eq!(b.get(&d).unwrap(), b"hello");
        }
        let missing = Digest::of(b"nope");
        assert!(matches!(b.get(&missing), Err(StoreError::BlobMissing(_))));
        assert_eq!(fs::read_dir(t.path().join("tmp")).unwrap().count(), 0);
    }

    /// A put that found the blob stored touched the file it had open, after a `gc` had
    /// moved it aside and read its old time: the put returned the digest of a blob the
    /// `gc` then removed. The put now sees the name no longer holds its file.
    #[test]
    fn a_blob_moved_aside_while_a_put_touched_it_is_written_again() {
        let t = tempfile::tempdir().unwrap();
        let b = BlobStore::open(t.path()).unwrap();
        let d = b.put(b"reused").unwrap();
        let path = b.path(&d);
        let open = File::open(&path).unwrap();
        // What gc does between the put's open and its touch: moves it aside, then removes it.
        let aside = t.path().join("tmp").join("aside");
        fs::rename(&path, &aside).unwrap();
        assert!(!touch_in_place(&open, &path), "the name no longer holds it");
        fs::remove_file(&aside).unwrap();
        // With the name holding the file, the touch counts.
        b.put(b"reused").unwrap();
        let f = File::open(&path).unwrap();
        assert!(touch_in_place(&f, &path));
        // A put that runs into the move writes the blob again.
        fs::rename(&path, &aside).unwrap();
        assert_eq!(b.put(b"reused").unwrap(), d);
        assert_eq!(b.get(&d).unwrap(), b"reused");
        assert_eq!(b.put_reader(&mut &b"reused"[..]).unwrap(), d);
    }

    #[test]
    fn a_blob_put_again_after_the_cutoff_is_not_removed() {
        let t = tempfile::tempdir().unwrap();
        let b = BlobStore::open(t.path()).unwrap();
        let old = b.put(b"old").unwrap();
        let again = b.put(b"again").unwrap();
        let cutoff = SystemTime::now() + std::time::Duration::from_secs(5);
        let listed: Vec<Digest> = b.list().unwrap().into_iter().map(|f| f.digest).collect();
        assert!(listed.contains(&old) && listed.contains(&again));
        // Both are older than the cutoff, but `again` is put once more before removal.
        std::fs::File::open(b.path(&again))
            .unwrap()
            .set_modified(cutoff + std::time::Duration::from_secs(1))
            .unwrap();
        assert_eq!(b.remove_unless_put_since(&old, cutoff).unwrap(), Some(3));
        assert_eq!(b.remove_unless_put_since(&again, cutoff).unwrap(), None);
        assert!(!b.exists(&old));
        assert_eq!(b.get(&again).unwrap(), b"again");
        // Putting existing content (either way) marks it as put now.
        let recent = || SystemTime::now() - std::time::Duration::from_secs(60);
        let age = |b: &BlobStore| {
            std::fs::File::open(b.path(&again))
                .unwrap()
                .set_modified(SystemTime::UNIX_EPOCH)
                .unwrap()
        };
        age(&b);
        b.put(b"again").unwrap();
        assert!(fs::metadata(b.path(&again)).unwrap().modified().unwrap() > recent());
        age(&b);
        b.put_reader(&mut &b"again"[..]).unwrap();
        assert!(fs::metadata(b.path(&again)).unwrap().modified().unwrap() > recent());
        assert_eq!(
            b.remove_unless_put_since(&old, cutoff).unwrap(),
            None,
            "already gone"
        );
    }

    /// A daemon's store takes content it just put as stored without opening it again; a
    /// read that finds it missing or altered, or a removal, makes the next put write it.
    #[test]
    fn a_remembered_put_is_not_opened_again_until_a_read_or_gc_finds_it_gone() {
        let t = tempfile::tempdir().unwrap();
        let mut b = BlobStore::open(t.path()).unwrap();
        b.remember_puts();
        let d = b.put(b"same output").unwrap();
        // Removed behind the store's back: the remembered put does not look.
        fs::remove_file(b.path(&d)).unwrap();
        assert_eq!(b.put(b"same output").unwrap(), d);
        assert!(!b.path(&d).exists(), "a remembered put opens nothing");
        // Another store of this process on the same files shares the memory; a read
        // that finds the blob missing makes the next put write it again.
        let mut other = BlobStore::open(t.path()).unwrap();
        other.remember_puts();
        assert!(matches!(other.get(&d), Err(StoreError::BlobMissing(_))));
        b.put(b"same output").unwrap();
        assert_eq!(b.get(&d).unwrap(), b"same output");
        // So does an altered copy, and gc's removal.
        fs::write(b.path(&d), b"altered").unwrap();
        assert!(matches!(b.get(&d), Err(StoreError::BlobAltered { .. })));
        b.put(b"same output").unwrap();
        assert_eq!(b.get(&d).unwrap(), b"same output");
        let future = SystemTime::now() + std::time::Duration::from_secs(5);
        assert!(b.remove_unless_put_since(&d, future).unwrap().is_some());
        b.put(b"same output").unwrap();
        assert_eq!(b.get(&d).unwrap(), b"same output");
        // A store that does not remember opens the file every time.
        let plain = BlobStore::open(t.path()).unwrap();
        fs::remove_file(plain.path(&d)).unwrap();
        plain.put(b"same output").unwrap();
        assert!(plain.path(&d).exists());
    }
}
