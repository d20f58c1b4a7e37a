//! Whether the storage can serve requests, for `GET /readyz`.
//!
//! A readiness probe must answer within the prober's own timeout (a
//! second by default on Kubernetes), also when a database is unreachable
//! and a ping would hang. So every master is pinged at once, each for at
//! most the readiness timeout, and the answer names the clusters that did
//! not answer: one dead cluster neither delays the verdict on the others
//! nor adds its wait to theirs.

use std::time::Duration;

use crate::error::Error;
use crate::Store;

impl Store {
    /// Pings the master of every cluster, all at once, each for at most
    /// `timeout`; returns the clusters that did not answer, with why.
    pub async fn unready_clusters(&self, timeout: Duration) -> Vec<(String, Error)> {
        let pings = self.inner.clusters.iter().map(|cluster| async move {
            let name = cluster.master.cluster().to_string();
            match tokio::time::timeout(timeout, cluster.master.ping()).await {
                Ok(Ok(())) => None,
                Ok(Err(error)) => Some((name, error)),
                Err(_) => {
                    let source = crate::storage::no_answer(timeout);
                    Some((name.clone(), Error::from_sqlx(&name, source)))
                }
            }
        });
        futures::future::join_all(pings)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}
