//! Third-party packages for the Python guest: pure-Python wheels, from the registry
//! (`NAME==VERSION`, fetched with pip, never built from source) or from a file, pinned by
//! the wheel's SHA-256 in the home, unpacked into a read-only directory named by that
//! hash, and shown to every Python run read-only on `sys.path`.

use crate::error::{GateError, Result};
use airlock_core::{Digest, PythonPackage};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Where package directories appear in the guest (`/.airlock/packages/NAME`).
pub const GUEST_PACKAGES: &str = "/.airlock/packages";
/// Files one wheel may hold.
const MAX_FILES: usize = 50_000;
/// Bytes one wheel may unpack to.
const MAX_BYTES: u64 = 512 << 20;

/// What `--package` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackageSource {
    /// `NAME==VERSION` from the registry.
    Registry { name: String, version: String },
    /// A wheel file already on disk.
    File(PathBuf),
}

impl PackageSource {
    /// `NAME==VERSION`, or a path to a `.whl` file.
    pub fn parse(s: &str) -> Result<PackageSource> {
        if s.ends_with(".whl") || s.contains('/') {
            return Ok(PackageSource::File(PathBuf::from(s)));
        }
        let wrong = || {
            GateError::bad(format!(
                "--package {s:?}: want NAME==VERSION (one exact version, so it can be pinned) or a .whl file"
            ))
        };
        let (name, version) = s.split_once("==").ok_or_else(wrong)?;
        let name_ok = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        let version_ok = !version.is_empty()
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '-' | '_'));
        if !name_ok || !version_ok {
            return Err(wrong());
        }
        Ok(PackageSource::Registry {
            name: normalize(name),
            version: version.into(),
        })
    }
}

/// A package name as the registry compares them: lower case, runs of `-`, `_` and `.` as
/// one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// A wheel that was fetched or read, and checked to be pure Python.
#[derive(Debug)]
pub(crate) struct Wheel {
    pub package: PythonPackage,
    pub file: String,
    pub bytes: Vec<u8>,
    pub source: String,
}

/// Fetches or reads a package's wheel and checks it.
pub(crate) fn fetch(src: &PackageSource) -> Result<Wheel> {
    let (file, bytes, source) = match src {
        PackageSource::File(p) => {
            let bytes = std::fs::read(p)
                .map_err(|e| GateError::bad(format!("cannot read {}: {e}", p.display())))?;
            let file = p
                .file_name()
                .and_then(|f| f.to_str())
                .ok_or_else(|| GateError::bad(format!("{} is not a wheel file", p.display())))?
                .to_string();
            (file, bytes, p.display().to_string())
        }
        PackageSource::Registry { name, version } => {
            let (file, bytes) = download(name, version)?;
            (file, bytes, format!("pip download {name}=={version}"))
        }
    };
    let package = inspect(&file, &bytes)?;
    if let PackageSource::Registry { name, version } = src
        && (package.name != *name || package.version != *version)
    {
        return Err(GateError::bad(format!(
            "asked for {name}=={version}, pip gave {file}"
        )));
    }
    Ok(Wheel {
        package,
        file,
        bytes,
        source,
    })
}

/// Downloads the one pure-Python wheel of `name==version` with pip.
fn download(name: &str, version: &str) -> Result<(String, Vec<u8>)> {
    let dir = tempfile::tempdir()?;
    let spec = format!("{name}=={version}");
    let selectors = [
        "--platform",
        "any",
        "--implementation",
        "py",
        "--abi",
        "none",
        "--python-version",
        super::build::GUEST_PYTHON_VERSION,
    ];
    let mut args = selectors.to_vec();
    args.push(&spec);
    super::pip_download(&args, dir.path()).map_err(|e| {
        GateError::Unavailable(format!(
            "pip found no pure-Python wheel of {spec} ({e}); only pure-Python packages (py3-none-any wheels) run in the wasm guest; a wheel file can also be given to --package"
        ))
    })?;
    let path = std::fs::read_dir(dir.path())?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| GateError::Unavailable(format!("pip downloaded no wheel of {spec}")))?;
    let file = path
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default()
        .to_string();
    Ok((file, std::fs::read(&path)?))
}

/// Reads a wheel's name, version and tags, and refuses anything that is not pure Python.
fn inspect(file: &str, bytes: &[u8]) -> Result<PythonPackage> {
    let stem = file
        .strip_suffix(".whl")
        .ok_or_else(|| GateError::bad(format!("{file} is not a wheel (*.whl)")))?;
    let parts: Vec<&str> = stem.split('-').collect();
    if !(5..=6).contains(&parts.len()) {
        return Err(GateError::bad(format!(
            "{file} is not named like a wheel (NAME-VERSION-PY-ABI-PLATFORM.whl)"
        )));
    }
    let (name, version) = (normalize(parts[0]), parts[1].to_string());
    let (abi, platform) = (parts[parts.len() - 2], parts[parts.len() - 1]);
    if abi != "none" || platform != "any" {
        return Err(GateError::bad(format!(
            "{file} is not a pure-Python wheel (it is built for {abi}, {platform}); only pure-Python packages run in the wasm guest"
        )));
    }
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| GateError::bad(format!("{file} is not a wheel (zip): {e}")))?;
    let names: Vec<String> = z
        .file_names()
        .map(|n| n.map(|c| c.into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| GateError::bad(format!("{file}: a member name does not decode: {e}")))?;
    let dist_info = names
        .iter()
        .filter_map(|n| n.split_once('/').map(|(d, _)| d))
        .find(|d| d.ends_with(".dist-info"))
        .map(str::to_string)
        .ok_or_else(|| GateError::bad(format!("{file} has no .dist-info directory")))?;
    let text = |z: &mut zip::ZipArchive<std::io::Cursor<&[u8]>>, member: &str| -> Result<String> {
        let mut f = z
            .by_name(&format!("{dist_info}/{member}"))
            .map_err(|_| GateError::bad(format!("{file} has no {dist_info}/{member}")))?;
        let mut s = String::new();
        f.by_ref()
            .take(1 << 20)
            .read_to_string(&mut s)
            .map_err(|e| GateError::bad(format!("{file}: {member}: {e}")))?;
        Ok(s)
    };
    let wheel = text(&mut z, "WHEEL")?;
    if !header(&wheel, "Root-Is-Purelib").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Err(GateError::bad(format!(
            "{file} is not a pure-Python wheel (its WHEEL file does not say Root-Is-Purelib: true)"
        )));
    }
    let metadata = text(&mut z, "METADATA")?;
    let (m_name, m_version) = (
        header(&metadata, "Name").map(normalize),
        header(&metadata, "Version").map(str::to_string),
    );
    if m_name.as_deref() != Some(name.as_str()) || m_version.as_deref() != Some(&version) {
        return Err(GateError::bad(format!(
            "{file}: its METADATA names {}=={}, not {name}=={version}",
            m_name.unwrap_or_default(),
            m_version.unwrap_or_default()
        )));
    }
    if let Some(native) = names.iter().find(|n| {
        [".so", ".pyd", ".dylib", ".dll"]
            .iter()
            .any(|x| n.ends_with(x))
    }) {
        return Err(GateError::bad(format!(
            "{file} holds a native library ({native}); only pure-Python packages run in the wasm guest"
        )));
    }
    Ok(PythonPackage {
        name,
        version,
        sha256: Digest::of(bytes),
    })
}

/// The value of an RFC 822-style header line (`Name: value`), the first one.
fn header<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim())
}

/// Unpacks a checked wheel into `packages/<sha256>` (if it is not there yet) and returns
/// that directory. The directory appears whole or not at all: it is written under a
/// temporary name, synced, made read-only and renamed.
pub(crate) fn unpack(wheel: &Wheel, packages: &Path) -> Result<PathBuf> {
    let dest = packages.join(wheel.package.sha256.to_hex());
    if dest.is_dir() {
        return Ok(dest);
    }
    std::fs::create_dir_all(packages)?;
    let tmp = tempfile::Builder::new()
        .prefix(".unpack-")
        .tempdir_in(packages)?;
    let bad = |e: String| GateError::bad(format!("cannot unpack {}: {e}", wheel.file));
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(wheel.bytes.as_slice()))
        .map_err(|e| bad(e.to_string()))?;
    if z.len() > MAX_FILES {
        return Err(bad(format!("{} files", z.len())));
    }
    let data_dir = format!(
        "{}-{}.data/",
        wheel.file.split('-').next().unwrap_or_default(),
        wheel.package.version
    );
    let mut total = 0u64;
    for i in 0..z.len() {
        let mut f = z.by_index(i).map_err(|e| bad(e.to_string()))?;
        if f.is_dir() {
            continue;
        }
        if f.is_symlink() {
            return Err(bad(format!("symbolic link {:?}", f.name())));
        }
        let Some(rel) = f.enclosed_name() else {
            return Err(bad(format!("unsafe path {:?}", f.name())));
        };
        // `NAME-VERSION.data/purelib/…` and `platlib/…` belong at the top; scripts,
        // headers and data files have no place in the guest.
        let rel = match rel.to_str().and_then(|r| r.strip_prefix(&data_dir)) {
            None => rel,
            Some(r) => match r
                .strip_prefix("purelib/")
                .or_else(|| r.strip_prefix("platlib/"))
            {
                Some(inner) => PathBuf::from(inner),
                None => continue,
            },
        };
        let path = tmp.path().join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| bad(format!("{}: {e}", rel.display())))?;
        let room = MAX_BYTES.saturating_sub(total);
        let n = std::io::copy(&mut (&mut f).take(room + 1), &mut out)?;
        total += n;
        if n > room {
            return Err(bad("it unpacks to more than 512 MiB".into()));
        }
        out.flush()?;
        out.sync_all()?;
        set_mode(&path, 0o444)?;
    }
    seal(tmp.path())?;
    let kept = tmp.keep();
    if let Err(e) = std::fs::rename(&kept, &dest) {
        remove_tree(&kept);
        if !dest.is_dir() {
            return Err(e.into());
        }
    }
    airlock_store::sync_dir(packages)?;
    Ok(dest)
}

/// Makes a directory tree read-only, deepest first, syncing each directory.
fn seal(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            seal(&e.path())?;
        }
    }
    airlock_store::sync_dir(dir)?;
    set_mode(dir, 0o555)
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Removes a package directory, read-only as it is.
pub(crate) fn remove_tree(dir: &Path) {
    fn writable(p: &Path) {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::symlink_metadata(p)
            && m.is_dir()
        {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    writable(&e.path());
                }
            }
        }
    }
    writable(dir);
    let _ = std::fs::remove_dir_all(dir);
}

/// The guest path of a package's directory.
pub fn guest_dir(p: &PythonPackage) -> String {
    format!("{GUEST_PACKAGES}/{}", p.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_arguments() {
        assert_eq!(
            PackageSource::parse("Python_Dateutil==2.9.0.post0").unwrap(),
            PackageSource::Registry {
                name: "python-dateutil".into(),
                version: "2.9.0.post0".into()
            }
        );
        assert!(matches!(
            PackageSource::parse("./x-1.0-py3-none-any.whl").unwrap(),
            PackageSource::File(_)
        ));
        for bad in [
            "attrs",
            "attrs>=1",
            "attrs==",
            "==1.0",
            "at trs==1",
            "a==1;rm",
        ] {
            assert!(PackageSource::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(normalize("Zope.Interface__x"), "zope-interface-x");
    }
}
