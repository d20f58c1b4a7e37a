//! Named leases held in the database, with fencing tokens.
//!
//! A lease is a row of `cellgate_leases` on a cluster: `name`, `holder`,
//! `token`, `expires_at`. A process takes a free or expired lease by
//! raising its token (`UPDATE … SET token = token + 1 … WHERE token = <the
//! token it read>`), renews it before it expires, and releases it by
//! expiring it. The token is the fence: work done under a lease commits
//! only in a transaction that first locks the lease rows and finds them
//! still held by the same holder with the same tokens ([`fence`]), so a
//! process that stalled past its lease and lost it cannot commit anything
//! afterwards, even if it does not know yet.
//!
//! Processes also hold a `member:<holder>` lease per cluster, which is how
//! they count each other to share work fairly ([`live_members`]).
//!
//! **Lock order.** Every statement that locks several lease rows locks
//! them in name order: the [`fence`] of a pass, a renewal, a takeover of
//! many and a release (`Dialect::lock_in_order`). A renewal that locked the
//! rows in the order the database came across them could wait for a pass's
//! fence while holding a row that the fence waited for; PostgreSQL finds
//! such a cycle only after its `deadlock_timeout` (a second by default),
//! then aborts one of the two, so each one stalled the index for a second.
//!
//! **Expiry is judged by the database's clock**, in the statements
//! themselves: a takeover ([`acquire`]) matches only a row that is ours or
//! expired (by a margin the caller chooses) *now*, a renewal ([`renew`])
//! only a row that has not expired, and the [`fence`] only rows that have
//! not. The two conditional updates exclude each other on the locked row,
//! so a renewal racing a takeover leaves one holder, whatever the clocks of
//! the two gateways say; a takeover always raises the token. A holder stops
//! using a lease by its own clock at the expiry it wrote, so a takeover
//! margin covers the skew between a holder's clock and the database's.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::storage::{ddl, Backend, Dialect, Sql, Tx, Value};

/// A lease this process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub token: i64,
    pub expires_at: DateTime<Utc>,
}

/// What a lease row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub name: String,
    pub holder: String,
    pub token: i64,
    pub expires_at: DateTime<Utc>,
}

fn now() -> DateTime<Utc> {
    crate::storage::value::truncate_to_micros(Utc::now())
}

fn epoch() -> DateTime<Utc> {
    DateTime::UNIX_EPOCH
}

fn expiry(ttl: Duration) -> DateTime<Utc> {
    now() + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::seconds(10))
}

/// The lease rows whose names start with `prefix`.
pub async fn list(backend: &dyn Backend, prefix: &str) -> Result<Vec<LeaseRow>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(["name", "holder", "token", "expires_at"])
        .push(" FROM ")
        .ident(ddl::LEASES_TABLE)
        .push(" WHERE ")
        .ident("name")
        .push(" LIKE ")
        .bind(Value::Text(format!("{}%", like_escape(prefix))))
        .push(backend.dialect().like_escape());
    Ok(backend
        .rows::<(String, String, i64, DateTime<Utc>)>(&sql)
        .await?
        .into_iter()
        .map(|(name, holder, token, expires_at)| LeaseRow {
            name,
            holder,
            token,
            expires_at,
        })
        .collect())
}

/// `LIKE` treats `_` and `%` as wildcards; names use `_` freely.
fn like_escape(text: &str) -> String {
    text.replace('\\', "\\\\")
        .replace('%', "\\%")
        .replace('_', "\\_")
}

/// Creates the rows of `names` that do not exist yet, free (expired).
pub async fn ensure(backend: &dyn Backend, names: &[String]) -> Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let dialect = backend.dialect();
    for chunk in names.chunks(1000) {
        let mut sql = Sql::new(dialect);
        sql.push(dialect.insert_ignore())
            .ident(ddl::LEASES_TABLE)
            .push(" (")
            .idents(["name", "holder", "token", "expires_at", "acquired_at"])
            .push(") ")
            .rows(chunk.iter().map(|name| {
                vec![
                    Value::Text(name.clone()),
                    Value::Text(String::new()),
                    Value::Int(0),
                    Value::DateTime(epoch()),
                    Value::DateTime(epoch()),
                ]
            }))
            .push(dialect.on_conflict_do_nothing());
        backend.execute(&sql).await?;
    }
    Ok(())
}

/// Takes `row`'s lease for `holder` if it is still as read (same token)
/// and, by the database's clock, ours or expired for at least `margin`.
/// `None` when another process was faster or the lease is still held.
pub async fn acquire(
    backend: &dyn Backend,
    row: &LeaseRow,
    holder: &str,
    ttl: Duration,
    margin: Duration,
) -> Result<Option<Lease>> {
    let expires_at = expiry(ttl);
    let sql = takeover(
        backend.dialect(),
        std::slice::from_ref(row),
        holder,
        expires_at,
        margin,
    );
    if backend.execute(&sql).await? == 1 {
        Ok(Some(Lease {
            name: row.name.clone(),
            token: row.token + 1,
            expires_at,
        }))
    } else {
        Ok(None)
    }
}

/// The `UPDATE` that takes `rows` for `holder` until `expires_at`, raising
/// each token, where each row is still as read and ours or expired
/// ([`takeover_condition`]).
fn takeover(
    dialect: Dialect,
    rows: &[LeaseRow],
    holder: &str,
    expires_at: DateTime<Utc>,
    margin: Duration,
) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push("UPDATE ")
        .ident(ddl::LEASES_TABLE)
        .push(" SET ")
        .ident("holder")
        .push(" = ")
        .bind(Value::Text(holder.to_string()))
        .push(", ")
        .ident("token")
        .push(" = ")
        .ident("token")
        .push(" + 1, ")
        .ident("expires_at")
        .push(" = ")
        .bind(Value::DateTime(expires_at))
        .push(", ")
        .ident("acquired_at")
        .push(" = ")
        .bind(Value::DateTime(now()))
        .push(" WHERE ");
    dialect.lock_in_order(
        &mut sql,
        ddl::LEASES_TABLE,
        "name",
        rows.iter().map(|r| Value::Text(r.name.clone())),
    );
    sql.push("(");
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        takeover_condition(&mut sql, row, holder, margin);
    }
    sql.push(")");
    dialect.update_order(&mut sql, "name");
    sql
}

/// `(name = ? AND token = ? AND (holder = ? OR expires_at < <clock - margin>))`:
/// the row as read, still ours or expired by the database's clock.
fn takeover_condition(sql: &mut Sql, row: &LeaseRow, holder: &str, margin: Duration) {
    let dialect = sql.dialect();
    sql.push("(")
        .ident("name")
        .push(" = ")
        .bind(Value::Text(row.name.clone()))
        .push(" AND ")
        .ident("token")
        .push(" = ")
        .bind(Value::Int(row.token))
        .push(" AND (")
        .ident("holder")
        .push(" = ")
        .bind(Value::Text(holder.to_string()))
        .push(" OR ")
        .ident("expires_at")
        .push(" < ");
    dialect.push_clock_minus(sql, margin);
    sql.push("))");
}

/// Appends `WHERE holder = ? AND name IN (…)`.
fn where_held(sql: &mut Sql, holder: &str, names: impl IntoIterator<Item = String>) {
    sql.push(" WHERE ");
    and_held(sql, holder, names);
}

/// Appends `holder = ? AND name IN (…)`.
fn and_held(sql: &mut Sql, holder: &str, names: impl IntoIterator<Item = String>) {
    sql.ident("holder")
        .push(" = ")
        .bind(Value::Text(holder.to_string()))
        .push(" AND ")
        .ident("name")
        .in_list(names.into_iter().map(Value::Text));
}

/// The leases among `names` that `holder` holds, unexpired by the
/// database's clock, with the token `wanted` gives for each, stamped with
/// `expires_at`.
async fn still_held(
    backend: &dyn Backend,
    holder: &str,
    wanted: &HashMap<&str, i64>,
    expires_at: DateTime<Utc>,
) -> Result<Vec<Lease>> {
    let mut check = Sql::new(backend.dialect());
    check
        .push("SELECT ")
        .idents(["name", "token"])
        .push(" FROM ")
        .ident(ddl::LEASES_TABLE);
    where_held(&mut check, holder, wanted.keys().map(|n| n.to_string()));
    // A renewal that matched no row (the lease had expired) leaves the row
    // ours with the old token: only an unexpired row counts as held.
    check.push(" AND ").ident("expires_at").push(" > ");
    backend
        .dialect()
        .push_clock_minus(&mut check, Duration::ZERO);
    Ok(backend
        .rows::<(String, i64)>(&check)
        .await?
        .into_iter()
        .filter(|(name, token)| wanted.get(name.as_str()) == Some(token))
        .map(|(name, token)| Lease {
            name,
            token,
            expires_at,
        })
        .collect())
}

/// Takes every lease of `rows` that is still as read and, by the
/// database's clock, ours or expired for at least `margin`, in two
/// statements; returns the ones taken. For a process that wants them all,
/// which is the common case of a single gateway.
pub async fn acquire_all(
    backend: &dyn Backend,
    rows: &[LeaseRow],
    holder: &str,
    ttl: Duration,
    margin: Duration,
) -> Result<Vec<Lease>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let expires_at = expiry(ttl);
    let update = takeover(backend.dialect(), rows, holder, expires_at, margin);
    backend.execute(&update).await?;
    let wanted: HashMap<&str, i64> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.token + 1))
        .collect();
    still_held(backend, holder, &wanted, expires_at).await
}

/// Extends the leases `held` by `holder` that have not expired by the
/// database's clock; returns those still held, with their new expiry. A
/// lease another process took, or one that expired (which must be taken
/// again, with a new token), is left out.
pub async fn renew(
    backend: &dyn Backend,
    holder: &str,
    held: &[Lease],
    ttl: Duration,
) -> Result<Vec<Lease>> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let dialect = backend.dialect();
    let expires_at = expiry(ttl);
    let tokens: HashMap<&str, i64> = held.iter().map(|l| (l.name.as_str(), l.token)).collect();
    let mut renewed = Vec::new();
    for chunk in held.chunks(1000) {
        let mut sql = Sql::new(dialect);
        sql.push("UPDATE ")
            .ident(ddl::LEASES_TABLE)
            .push(" SET ")
            .ident("expires_at")
            .push(" = ")
            .bind(Value::DateTime(expires_at))
            .push(" WHERE ");
        let names = || chunk.iter().map(|l| l.name.clone());
        dialect.lock_in_order(
            &mut sql,
            ddl::LEASES_TABLE,
            "name",
            names().map(Value::Text),
        );
        and_held(&mut sql, holder, names());
        sql.push(" AND ").ident("expires_at").push(" > ");
        dialect.push_clock_minus(&mut sql, Duration::ZERO);
        dialect.update_order(&mut sql, "name");
        backend.execute(&sql).await?;
        let wanted: HashMap<&str, i64> = chunk
            .iter()
            .filter_map(|l| Some((l.name.as_str(), *tokens.get(l.name.as_str())?)))
            .collect();
        renewed.extend(still_held(backend, holder, &wanted, expires_at).await?);
    }
    Ok(renewed)
}

/// Gives up leases: they expire at once, free for other processes.
pub async fn release(backend: &dyn Backend, holder: &str, names: &[String]) -> Result<()> {
    let dialect = backend.dialect();
    for chunk in names.chunks(1000) {
        let mut sql = Sql::new(dialect);
        sql.push("UPDATE ")
            .ident(ddl::LEASES_TABLE)
            .push(" SET ")
            .ident("expires_at")
            .push(" = ")
            .bind(Value::DateTime(epoch()))
            .push(" WHERE ");
        dialect.lock_in_order(
            &mut sql,
            ddl::LEASES_TABLE,
            "name",
            chunk.iter().cloned().map(Value::Text),
        );
        and_held(&mut sql, holder, chunk.iter().cloned());
        dialect.update_order(&mut sql, "name");
        backend.execute(&sql).await?;
    }
    Ok(())
}

/// A holder name of this process that no other process or holder shares:
/// `<host>:<pid>:<8 random hex digits>`.
pub(crate) fn new_holder() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_string());
    format!(
        "{host}:{}:{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// The member lease name of `holder`.
pub fn member_name(holder: &str) -> String {
    format!("member:{holder}")
}

/// Announces `holder` as a live member for `ttl` more.
pub async fn heartbeat(backend: &dyn Backend, holder: &str, ttl: Duration) -> Result<()> {
    let dialect = backend.dialect();
    let mut sql = Sql::new(dialect);
    sql.push("INSERT INTO ")
        .ident(ddl::LEASES_TABLE)
        .push(" (")
        .idents(["name", "holder", "token", "expires_at", "acquired_at"])
        .push(") ")
        .rows([vec![
            Value::Text(member_name(holder)),
            Value::Text(holder.to_string()),
            Value::Int(0),
            Value::DateTime(expiry(ttl)),
            Value::DateTime(now()),
        ]])
        .push(&dialect.upsert(&["name"], &["expires_at"]));
    backend.execute(&sql).await?;
    Ok(())
}

/// How many members are alive, and forgets members dead for an hour.
pub async fn live_members(backend: &dyn Backend) -> Result<usize> {
    let now = now();
    let rows = list(backend, "member:").await?;
    let dead: Vec<String> = rows
        .iter()
        .filter(|r| r.expires_at < now - chrono::Duration::hours(1))
        .map(|r| r.name.clone())
        .collect();
    if !dead.is_empty() {
        let mut sql = Sql::new(backend.dialect());
        sql.push("DELETE FROM ")
            .ident(ddl::LEASES_TABLE)
            .push(" WHERE ")
            .ident("name")
            .in_list(dead.into_iter().map(Value::Text));
        backend.execute(&sql).await?;
    }
    Ok(rows.iter().filter(|r| r.expires_at > now).count().max(1))
}

/// Inside a transaction: locks the rows of `held`, in name order (see the
/// module's *Lock order*), and fails with
/// [`Error::LeaseLost`] unless each is still held by `holder` with the
/// same token and has not expired by the database's clock. Everything the transaction does is
/// thereby fenced: a process that lost a lease cannot commit.
pub async fn fence(tx: &mut dyn Tx, dialect: Dialect, holder: &str, held: &[Lease]) -> Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    let mut sql = Sql::new(dialect);
    sql.push("SELECT ")
        .idents(["name", "holder", "token", "expires_at"])
        .push(" FROM ")
        .ident(ddl::LEASES_TABLE)
        .push(" WHERE ")
        .ident("name")
        .in_list(held.iter().map(|l| Value::Text(l.name.clone())))
        .push(" AND ")
        .ident("expires_at")
        .push(" > ");
    dialect.push_clock_minus(&mut sql, Duration::ZERO);
    sql.push(" ORDER BY ")
        .ident("name")
        .push(dialect.for_update());
    let found: HashMap<String, (String, i64, DateTime<Utc>)> = tx
        .rows::<(String, String, i64, DateTime<Utc>)>(&sql)
        .await?
        .into_iter()
        .map(|(n, h, t, e)| (n, (h, t, e)))
        .collect();
    for lease in held {
        match found.get(&lease.name) {
            // Rows past their expiry by the database's clock were not
            // selected.
            Some((h, t, _)) if h == holder && *t == lease.token => {}
            _ => return Err(Error::LeaseLost(lease.name.clone())),
        }
    }
    Ok(())
}
