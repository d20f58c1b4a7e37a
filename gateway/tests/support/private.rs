//! A private database server of either kind ([`crate::mariadb::Mariadb`],
//! [`crate::postgres::Postgres`]) behind one trait, for tests that run the
//! same scenario on both.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

/// A private database server, as the tests use it.
pub trait PrivateServer: Sized {
    /// `MariaDB` or `PostgreSQL`.
    const KIND: &'static str;
    fn init() -> Result<Self, String>;
    fn url(&self) -> String;
    async fn start(&mut self);
    /// `kill -9` of the server process.
    fn kill(&mut self);
}

macro_rules! private_server {
    ($ty:ty, $kind:literal) => {
        impl PrivateServer for $ty {
            const KIND: &'static str = $kind;
            fn init() -> Result<Self, String> {
                <$ty>::init()
            }
            fn url(&self) -> String {
                <$ty>::url(self)
            }
            async fn start(&mut self) {
                <$ty>::start(self).await
            }
            fn kill(&mut self) {
                self.stop("KILL")
            }
        }
    };
}
private_server!(crate::mariadb::Mariadb, "MariaDB");
private_server!(crate::postgres::Postgres, "PostgreSQL");
