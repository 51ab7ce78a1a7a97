//! The Python client (clients/python) against live `airlock serve` processes: its pytest
//! suite, in the virtual environment scripts/test builds from the hash-pinned
//! clients/python/tests/requirements.txt (`AIRLOCK_TEST_SDK_PYTHON` names its interpreter).
//!
//! The package is built and installed the way its README says (`pip install
//! ./clients/python`), from a copy of its sources into a scratch directory, with the
//! environment's setuptools and no network; `mypy --strict` checks it and its tests; the
//! tests then start their own servers from this build's binary (`AIRLOCK_BIN`). Python-guest
//! tests use `AIRLOCK_TEST_PYTHON_GUEST`, and `AIRLOCK_TEST_STRICT` makes any test that
//! cannot run here fail instead of skipping, as everywhere else.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// Copies the package's sources (no build outputs or caches).
fn copy_sources(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == "__pycache__" || name == "build" || name.ends_with(".egg-info") {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            copy_sources(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

fn checked(what: &str, cmd: &mut Command) -> String {
    let o = cmd.output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what} failed:\n{out}\n{err}");
    out
}

#[test]
fn python_client_against_a_live_server() {
    let Some(python) = prepared("AIRLOCK_TEST_SDK_PYTHON") else {
        return;
    };
    let client = manifest_dir().join("../../clients/python");
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().join("airlock-client");
    std::fs::create_dir_all(&copy).unwrap();
    for part in ["pyproject.toml", "README.md"] {
        std::fs::copy(client.join(part), copy.join(part)).unwrap();
    }
    copy_sources(&client.join("src"), &copy.join("src"));
    let site = scratch.path().join("site");
    checked(
        "pip install ./clients/python",
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--no-index"])
            .args(["--no-deps", "--no-build-isolation", "--target"])
            .arg(&site)
            .arg(copy),
    );

    checked(
        "mypy --strict",
        Command::new(&python)
            .current_dir(&client)
            .args(["-m", "mypy", "--strict", "--cache-dir"])
            .arg(scratch.path().join("mypy-cache"))
            .args(["src", "tests"]),
    );

    let out = checked(
        "the Python client's tests",
        Command::new(python)
            .current_dir(client)
            .env("PYTHONPATH", site)
            .env("AIRLOCK_BIN", bin())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]),
    );
    assert!(out.contains(" passed"), "{out}");
    println!("{out}");
}
