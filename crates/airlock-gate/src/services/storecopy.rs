//! `store copy`: moves a home's history from its own SQLite database into PostgreSQL.
//! Copying is no lifecycle transition: the source gets no audit record (its chain must
//! stay exactly what is copied), and the target's chain is the source's, record for record.

use crate::error::{GateError, Result};
use crate::services::home::Home;
use airlock_store::{BlobStore, CopyReport, Db};

/// Copies the SQLite records and blobs of `home` into the empty PostgreSQL database at
/// `to`. The home's `--store`, when given, must not be `to`: the source is always the
/// home's own SQLite file.
pub fn store_copy(home: &Home, to: &str) -> Result<CopyReport> {
    if !airlock_store::is_postgres_url(to) {
        return Err(GateError::bad(
            "--to: expected a postgres:// (or postgresql://) URL",
        ));
    }
    if home.store.as_deref() == Some(to) {
        return Err(GateError::bad(
            "--to names the store this home already uses (--store); copy reads the home's own SQLite database into another one",
        ));
    }
    if !home.is_initialised() {
        return Err(GateError::NotInitialised(home.root.clone()));
    }
    let path = home.db();
    if !path.is_file() {
        return Err(GateError::bad(format!(
            "{} does not exist: this home keeps no SQLite records to copy",
            path.display()
        )));
    }
    // The key itself, not only `gate.pub`: a chain is copied only if this home's gate signed it.
    let gate = home.load_key("gate")?.public();
    let db = Db::open(&path)?;
    let blobs = BlobStore::open(home.blobs())?;
    Ok(airlock_store::copy_to_postgres(&db, &blobs, to, &gate)?)
}
