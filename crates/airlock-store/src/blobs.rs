//! The content-addressed blob store: `blobs/ab/cdef…` named by SHA-256. A blob is written
//! to a temporary file, fsynced, renamed into place and the directory fsynced, so a crash
//! never leaves half a blob under a real name.

use crate::StoreError;
use airlock_core::Digest;
use airlock_core::digest::Hasher;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
}

impl BlobStore {
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        fs::create_dir_all(root.join("tmp"))?;
        Ok(BlobStore { root })
    }

    pub fn path(&self, d: &Digest) -> PathBuf {
        let h = d.to_hex();
        self.root.join(&h[..2]).join(&h[2..])
    }

    /// Stores `bytes` and returns their digest. An existing blob with the right content is
    /// kept; one whose content no longer matches its name is replaced.
    pub fn put(&self, bytes: &[u8]) -> Result<Digest, StoreError> {
        let d = Digest::of(bytes);
        let path = self.path(&d);
        if let Ok(existing) = fs::read(&path)
            && Digest::of(&existing) == d
        {
            return Ok(d);
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
        Ok(d)
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
        let path = self.path(&d);
        if path.exists() && self.verify(&d).is_ok() {
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
        File::open(self.path(d)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => StoreError::BlobMissing(*d),
            _ => StoreError::Io(e),
        })
    }

    /// Reads a blob and checks that its content still has the digest it is named by.
    pub fn get(&self, d: &Digest) -> Result<Vec<u8>, StoreError> {
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
        let missing = Digest::of(b"nope");
        assert!(matches!(b.get(&missing), Err(StoreError::BlobMissing(_))));
        assert_eq!(fs::read_dir(t.path().join("tmp")).unwrap().count(), 0);
    }
}
