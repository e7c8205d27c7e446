//! What orderly reads that a hardened cluster may withhold from a role that owns only its
//! database, said once at start with the GRANT that gives it. Nothing here is needed to serve:
//! `orderly_history_id()` (migrations 0009 and 0010) calls each function only where the role
//! may, and the server's start time stands in for the other two.

use deadpool_postgres::Pool;

use super::tx::{query_opt, Fault};
use crate::store::StoreError;

/// What the database going back in time, or losing its cache leases, may look like, and the
/// functions any one of which shows it (`orderly_history_id()`).
const SEEN_BY: [(&str, &[&str]); 3] = [
    (
        "a restart of PostgreSQL in place",
        &["pg_postmaster_start_time()"],
    ),
    (
        "a promoted standby",
        &["pg_postmaster_start_time()", "pg_current_wal_lsn()"],
    ),
    (
        "a restore into another cluster",
        &["pg_postmaster_start_time()", "pg_control_system()"],
    ),
];

/// The functions the history id reads (the timeline needs both WAL functions).
const READ: [&str; 4] = [
    "pg_postmaster_start_time()",
    "pg_current_wal_lsn()",
    "pg_walfile_name(pg_lsn)",
    "pg_control_system()",
];

/// Says in one warning what orderly cannot see because the role may not call one of `READ`,
/// and the GRANT that makes it seen. Silent when nothing is unseen.
pub(super) async fn report(pool: &Pool) -> Result<(), StoreError> {
    let client = pool.get().await.map_err(Fault::from)?;
    let mut withheld = Vec::new();
    for function in READ {
        let row = query_opt(
            &client,
            "SELECT has_function_privilege($1, 'EXECUTE')",
            &[&function],
        )
        .await?
        .expect("a SELECT without FROM returns a row");
        if !row.get::<_, bool>(0) {
            withheld.push(function);
        }
    }
    let role: String = query_opt(&client, "SELECT current_user::text", &[])
        .await?
        .expect("a SELECT without FROM returns a row")
        .get(0);
    if let Some(line) = warning(&withheld, &role) {
        log::warn!("{line}");
    }
    Ok(())
}

/// The one line said when `withheld` are withheld from `role`, if that leaves anything unseen.
fn warning(withheld: &[&str], role: &str) -> Option<String> {
    let may = |function: &str| {
        !withheld.contains(&function)
            && (function != "pg_current_wal_lsn()"
                || !withheld.contains(&"pg_walfile_name(pg_lsn)"))
    };
    let unseen: Vec<&str> = SEEN_BY
        .iter()
        .filter(|(_, by)| !by.iter().any(|f| may(f)))
        .map(|(what, _)| *what)
        .collect();
    if unseen.is_empty() {
        return None;
    }
    Some(format!(
        "PostgreSQL: the role {role} may not execute {}, so orderly does not see {} until the key counter shows it (an instance may serve a revoked key's copy for up to 1.5 s after); a superuser gives it with: GRANT EXECUTE ON FUNCTION {} TO \"{}\"",
        withheld.join(", "),
        unseen.join(", nor "),
        withheld.join(", "),
        role.replace('"', "\"\""),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_start_time_the_warning_names_what_goes_unseen_and_the_grant() {
        let line = warning(
            &["pg_postmaster_start_time()", "pg_control_system()"],
            "app",
        )
        .expect("a restart is unseen");
        assert!(line.contains("may not execute pg_postmaster_start_time(), pg_control_system()"));
        assert!(line.contains(
            "does not see a restart of PostgreSQL in place, nor a restore into another cluster"
        ));
        assert!(!line.contains("promoted"), "the timeline shows a promotion");
        assert!(line.ends_with(
            "GRANT EXECUTE ON FUNCTION pg_postmaster_start_time(), pg_control_system() TO \"app\""
        ));
    }

    #[test]
    fn the_start_time_alone_sees_everything_and_nothing_is_said() {
        let withheld = [
            "pg_current_wal_lsn()",
            "pg_walfile_name(pg_lsn)",
            "pg_control_system()",
        ];
        assert_eq!(warning(&withheld, "app"), None);
        assert_eq!(warning(&[], "app"), None);
    }

    #[test]
    fn a_timeline_needs_both_wal_functions() {
        let line = warning(
            &["pg_postmaster_start_time()", "pg_walfile_name(pg_lsn)"],
            "app",
        )
        .unwrap();
        assert!(line.contains("a promoted standby"), "{line}");
    }
}
