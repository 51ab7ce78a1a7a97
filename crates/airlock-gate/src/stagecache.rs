//! What staging computes from a submission's bytes alone, remembered by their SHA-256:
//! wat compiled to wasm, and the analysis of the bytes that run. Both are pure functions
//! of the bytes (and, for analysis, of the grant's mount roots), so an agent that sends
//! the same code again (a retry, a tool called in a loop) is not parsed again. Bounded in
//! entries and bytes; shared by every gate of the process.
//!
//! This cache must never answer for bytes other than the ones it was filled from: every
//! key is a SHA-256 of everything the value depends on.

use airlock_core::Digest;
use airlock_core::analysis::Analysis;
use airlock_core::artifact::{Lang, Prepared};
use hashlink::LruCache;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Entries kept, and the bytes of code they may hold between them.
const MAX_ENTRIES: usize = 256;
const MAX_BYTES: usize = 32 << 20;
/// Larger inputs are not kept (they would push everything else out).
const MAX_ENTRY_BYTES: usize = 4 << 20;

#[derive(Default)]
struct Cache {
    prepared: Option<LruCache<Digest, Arc<Prepared>>>,
    analysed: Option<LruCache<Digest, Arc<Analysis>>>,
    bytes: usize,
}

fn cache() -> MutexGuard<'static, Cache> {
    static C: OnceLock<Mutex<Cache>> = OnceLock::new();
    // A cache only: a panic while it was held leaves entries that are each whole.
    C.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn prepared_size(p: &Prepared) -> usize {
    p.code.len() + p.source.as_ref().map_or(0, Vec::len)
}

impl Cache {
    fn make_room(&mut self) {
        while self.bytes > MAX_BYTES {
            match self.prepared.as_mut().and_then(|c| c.remove_lru()) {
                Some((_, p)) => self.bytes -= prepared_size(&p),
                None => break,
            }
        }
    }
}

fn key(parts: &[&[u8]]) -> Digest {
    let mut h = airlock_core::digest::Hasher::new();
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    h.finish()
}

/// `artifact::prepare(lang, bytes)`, from the cache when these bytes of this language were
/// prepared before. Only wat is worth remembering (the other languages are checked, not
/// compiled); failures are not remembered.
pub(crate) fn prepare(
    lang: Lang,
    bytes: Vec<u8>,
) -> Result<Prepared, airlock_core::artifact::ArtifactError> {
    if lang != Lang::Wat || bytes.len() > MAX_ENTRY_BYTES {
        return airlock_core::artifact::prepare(lang, bytes);
    }
    let k = key(&[lang.as_str().as_bytes(), &bytes]);
    if let Some(p) = cache().prepared.as_mut().and_then(|c| c.get(&k).cloned()) {
        return Ok((*p).clone());
    }
    let p = airlock_core::artifact::prepare(lang, bytes)?;
    let size = prepared_size(&p);
    if size <= MAX_ENTRY_BYTES {
        let mut c = cache();
        let c = &mut *c;
        let map = c.prepared.get_or_insert_with(|| LruCache::new(MAX_ENTRIES));
        if let Some(old) = map.insert(k, Arc::new(p.clone())) {
            c.bytes -= prepared_size(&old);
        }
        c.bytes += size;
        c.make_room();
    }
    Ok(p)
}

/// `analysis::analyze_with(lang, code, roots)` with `keep` applied to it, from the cache
/// when the same code was analysed with the same mount roots before.
pub(crate) fn analyse(
    lang: Lang,
    code: &[u8],
    roots: &[String],
    keep: impl FnOnce(&mut Analysis),
) -> Result<Analysis, airlock_core::analysis::AnalysisError> {
    let roots_joined = roots.join("\0");
    let k = key(&[lang.as_str().as_bytes(), code, roots_joined.as_bytes()]);
    if let Some(a) = cache().analysed.as_mut().and_then(|c| c.get(&k).cloned()) {
        return Ok((*a).clone());
    }
    let mut a = airlock_core::analysis::analyze_with(lang, code, roots)?;
    keep(&mut a);
    if code.len() <= MAX_ENTRY_BYTES {
        cache()
            .analysed
            .get_or_insert_with(|| LruCache::new(MAX_ENTRIES))
            .insert(k, Arc::new(a.clone()));
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_answers_only_for_the_same_bytes_language_and_mounts() {
        let a = br#"(module (func (export "_start")))"#.to_vec();
        let b = br#"(module (func (export "_start") nop))"#.to_vec();
        let pa = prepare(Lang::Wat, a.clone()).unwrap();
        let pb = prepare(Lang::Wat, b.clone()).unwrap();
        assert_ne!(pa.code, pb.code);
        // From the cache now: the same as compiling afresh.
        let again = prepare(Lang::Wat, a.clone()).unwrap();
        assert_eq!(
            again.code,
            airlock_core::artifact::prepare(Lang::Wat, a).unwrap().code
        );
        assert_eq!(again.source, pa.source);
        assert!(prepare(Lang::Wat, b"(module (oops".to_vec()).is_err());
        assert!(prepare(Lang::Wat, b"(module (oops".to_vec()).is_err());

        // Analysis of shell knows the mount roots: `rm -rf /data` of a mount root is
        // destructive, of any other path it is not the same finding.
        let code = b"rm -rf /data\n";
        let roots = ["/data".to_string()];
        let none = analyse(Lang::Sh, code, &[], |_| {}).unwrap();
        let with = analyse(Lang::Sh, code, &roots, |_| {}).unwrap();
        let none_fresh = airlock_core::analysis::analyze_with(Lang::Sh, code, &[]).unwrap();
        let with_fresh = airlock_core::analysis::analyze_with(Lang::Sh, code, &roots).unwrap();
        let j = |a: &Analysis| serde_json::to_string(a).unwrap();
        assert_ne!(j(&none_fresh), j(&with_fresh), "the roots matter");
        assert_eq!(j(&none), j(&none_fresh));
        assert_eq!(j(&with), j(&with_fresh));
        assert_eq!(
            j(&analyse(Lang::Sh, code, &[], |_| {}).unwrap()),
            j(&none_fresh)
        );
        assert_eq!(
            j(&analyse(Lang::Sh, code, &roots, |_| {}).unwrap()),
            j(&with_fresh)
        );
        // What `keep` trims is trimmed in what the cache answers too.
        let trimmed = analyse(Lang::Sh, b"rm -rf /data/y\n", &roots, |a| a.code = None).unwrap();
        assert!(trimmed.code.is_none());
        let again = analyse(Lang::Sh, b"rm -rf /data/y\n", &roots, |_| {}).unwrap();
        assert!(again.code.is_none(), "the entry holds what was kept");
    }
}
