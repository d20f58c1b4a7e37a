//! How database failures reach clients: every error that says a database
//! went away, is going down, or does not answer is `STORAGE_UNAVAILABLE`
//! (retryable), and an error about the statement stays `INTERNAL`.
//!
//! The errors are real sqlx error values: the tests talk through
//! [`cellgate_store::storage::connect`] to small fake servers on loopback that
//! speak just enough of the PostgreSQL and MySQL wire protocols to send a
//! chosen error, at start-up or in answer to the first statement, to
//! listeners that accept and never answer, and to closed ports. With
//! `CELLGATE_TEST_POSTGRES_URL` / `CELLGATE_TEST_MYSQL_URL` set, the real
//! servers also terminate a session and run a statement past the timeout.

use std::time::Duration;

use cellgate_store::storage::{self, Backend, ConnectOptions, Dialect, Sql};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Short timeouts: the tests wait for failures, not for answers.
fn options() -> ConnectOptions {
    ConnectOptions {
        cluster: "main".to_string(),
        max_connections: 2,
        acquire_timeout: Duration::from_millis(500),
        statement_timeout: Duration::from_millis(500),
        background: false,
    }
}

/// Bounds a step that must end, so a hang fails the test instead of
/// stalling it (generous: only a hang can exceed it).
async fn ends<T>(what: &str, work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within 60 s"))
}

async fn backend(url: &str) -> std::sync::Arc<dyn Backend> {
    storage::connect(url, &options())
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// The SQLSTATE (PostgreSQL) or error number (MySQL) of the driver error
/// under `error`, if it is a database error.
fn database_code(error: &cellgate_store::Error) -> Option<String> {
    let source = match error {
        cellgate_store::Error::Unavailable { source, .. }
        | cellgate_store::Error::Storage(source) => source,
        _ => return None,
    };
    let db = source.as_database_error()?;
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return Some(my.number().to_string());
    }
    db.code().map(|c| c.to_string())
}

/// Checks the code of `error` and, for a database error, that it is the
/// one the fake server sent (a malformed fake would produce a protocol
/// error instead, which is also unavailability and would prove nothing).
fn assert_error(what: &str, error: &cellgate_store::Error, sent: Option<&str>, code: &str) {
    assert_eq!(error.code(), code, "{what}: {error:?}");
    assert_eq!(
        error.is_transient(),
        code == "STORAGE_UNAVAILABLE",
        "{what}"
    );
    if let Some(sent) = sent {
        assert_eq!(
            database_code(error).as_deref(),
            Some(sent),
            "{what}: {error:?}"
        );
    }
    let message = error.client_message();
    assert!(!message.contains("127.0.0.1"), "{what}: {message}");
}

/// A listener on a free loopback port.
async fn listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    (listener, port)
}

/// When a fake server sends its error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// Instead of accepting the login.
    Login,
    /// In answer to the first statement after a successful login.
    FirstStatement,
    /// Never: the first statement gets no answer at all.
    NotAtAll,
}

/// Serves one PostgreSQL connection: SSL refused, login accepted or
/// refused, then `ErrorResponse` with `sqlstate` and the connection closed.
/// Returns whether the client closed the connection itself (end of stream
/// seen) after the failure.
async fn fake_postgres(listener: TcpListener, when: When, sqlstate: &'static str) -> bool {
    let (mut stream, _) = listener.accept().await.expect("accept");
    loop {
        let len = stream.read_u32().await.expect("startup length") as usize;
        let mut body = vec![0; len - 4];
        stream.read_exact(&mut body).await.expect("startup body");
        if body[..4] == 80877103u32.to_be_bytes() {
            stream.write_all(b"N").await.expect("refuse SSL");
            continue;
        }
        break;
    }
    let error = pg_error(sqlstate);
    if when == When::Login {
        stream.write_all(&error).await.expect("send error");
        return false;
    }
    let mut login = Vec::new();
    login.extend_from_slice(&[b'R', 0, 0, 0, 8, 0, 0, 0, 0]);
    login.extend_from_slice(&[b'K', 0, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 2]);
    login.extend_from_slice(&[b'Z', 0, 0, 0, 5, b'I']);
    stream.write_all(&login).await.expect("send login");
    let kind = stream.read_u8().await.expect("first statement");
    let len = stream.read_u32().await.expect("message length") as usize;
    let mut body = vec![0; len - 4];
    stream.read_exact(&mut body).await.expect("message body");
    assert!(b"PQ".contains(&kind), "unexpected message {kind}");
    match when {
        When::NotAtAll => closed_by_client(&mut stream).await,
        _ => {
            stream.write_all(&error).await.expect("send error");
            false
        }
    }
}

/// A fatal PostgreSQL `ErrorResponse`.
fn pg_error(sqlstate: &str) -> Vec<u8> {
    let mut fields = Vec::new();
    for (tag, text) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', sqlstate),
        (
            b'M',
            "terminating connection due to unexpected postmaster exit",
        ),
    ] {
        fields.push(tag);
        fields.extend_from_slice(text.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut message = vec![b'E'];
    message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
    message.extend_from_slice(&fields);
    message
}

/// Reads until the client closes the connection; false if it does not
/// within a generous time.
async fn closed_by_client(stream: &mut TcpStream) -> bool {
    let drain = async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), drain)
        .await
        .is_ok()
}

/// One MySQL packet: 3-byte length, sequence number, payload.
fn my_packet(sequence: u8, payload: &[u8]) -> Vec<u8> {
    let mut packet = (payload.len() as u32).to_le_bytes()[..3].to_vec();
    packet.push(sequence);
    packet.extend_from_slice(payload);
    packet
}

async fn my_read_packet(stream: &mut TcpStream) -> Vec<u8> {
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await.expect("packet head");
    let len = u32::from_le_bytes([head[0], head[1], head[2], 0]) as usize;
    let mut payload = vec![0; len];
    stream
        .read_exact(&mut payload)
        .await
        .expect("packet payload");
    payload
}

/// Serves one MySQL connection: a protocol-10 handshake without TLS, the
/// login accepted or refused, then an ERR packet with `number` and the
/// connection closed.
async fn fake_mysql(listener: TcpListener, when: When, number: u16) -> bool {
    let (mut stream, _) = listener.accept().await.expect("accept");
    let mut hello = vec![10];
    hello.extend_from_slice(b"8.0.36-fake\0");
    hello.extend_from_slice(&7u32.to_le_bytes());
    hello.extend_from_slice(b"abcdefgh\0");
    // LONG_PASSWORD | LONG_FLAG | CONNECT_WITH_DB | PROTOCOL_41 |
    // TRANSACTIONS | SECURE_CONNECTION; then MULTI_RESULTS | PLUGIN_AUTH |
    // PLUGIN_AUTH_LENENC_DATA.
    hello.extend_from_slice(&0xa20du16.to_le_bytes());
    hello.push(45);
    hello.extend_from_slice(&2u16.to_le_bytes());
    hello.extend_from_slice(&0x002au16.to_le_bytes());
    hello.push(21);
    hello.extend_from_slice(&[0; 10]);
    hello.extend_from_slice(b"ijklmnopqrst\0");
    hello.extend_from_slice(b"mysql_native_password\0");
    stream
        .write_all(&my_packet(0, &hello))
        .await
        .expect("send handshake");
    my_read_packet(&mut stream).await;
    let mut error = vec![0xff];
    error.extend_from_slice(&number.to_le_bytes());
    error.extend_from_slice(b"#HY000connection lost");
    if when == When::Login {
        stream
            .write_all(&my_packet(2, &error))
            .await
            .expect("send error");
        return false;
    }
    let ok = [0, 0, 0, 2, 0, 0, 0];
    stream.write_all(&my_packet(2, &ok)).await.expect("send ok");
    my_read_packet(&mut stream).await;
    match when {
        When::NotAtAll => closed_by_client(&mut stream).await,
        _ => {
            stream
                .write_all(&my_packet(1, &error))
                .await
                .expect("send error");
            false
        }
    }
}

// While PostgreSQL restarted, "terminating connection due to unexpected
// postmaster exit" (57P01) and its kin reached clients as INTERNAL.
#[tokio::test]
async fn postgres_connection_loss_is_storage_unavailable() {
    let cases = [
        (When::FirstStatement, "57P01", "STORAGE_UNAVAILABLE"),
        (When::FirstStatement, "57P02", "STORAGE_UNAVAILABLE"),
        (When::FirstStatement, "57P03", "STORAGE_UNAVAILABLE"),
        (When::FirstStatement, "57P05", "STORAGE_UNAVAILABLE"),
        (When::FirstStatement, "08006", "STORAGE_UNAVAILABLE"),
        (When::FirstStatement, "08003", "STORAGE_UNAVAILABLE"),
        (When::FirstStatement, "25P03", "STORAGE_UNAVAILABLE"),
        (When::Login, "08004", "STORAGE_UNAVAILABLE"),
        (When::Login, "08006", "STORAGE_UNAVAILABLE"),
        // About the statement or the credentials, not the connection.
        (When::FirstStatement, "42P01", "INTERNAL"),
        (When::FirstStatement, "57014", "INTERNAL"),
        (When::Login, "28P01", "INTERNAL"),
        (When::Login, "3D000", "INTERNAL"),
    ];
    for (when, sqlstate, code) in cases {
        let (listener, port) = listener().await;
        let server = tokio::spawn(fake_postgres(listener, when, sqlstate));
        let db = backend(&format!("postgres://cellgate@127.0.0.1:{port}/cells")).await;
        let error = ends("ping", db.ping())
            .await
            .expect_err("the server failed");
        assert_error(
            &format!("{when:?} {sqlstate}"),
            &error,
            Some(sqlstate),
            code,
        );
        server.await.expect("fake server");
    }
}

// MySQL/MariaDB server shutdown and lost-connection errors reached clients
// as INTERNAL.
#[tokio::test]
async fn mysql_connection_loss_is_storage_unavailable() {
    let mut cases = vec![(When::Login, 1040, "STORAGE_UNAVAILABLE")];
    for number in [
        1053, 1152, 1158, 1159, 1160, 1161, 1184, 1927, 2006, 2013, 3032, 4031,
    ] {
        cases.push((When::FirstStatement, number, "STORAGE_UNAVAILABLE"));
    }
    // About the statement or the credentials, not the connection.
    cases.extend([
        (When::FirstStatement, 1146, "INTERNAL"),
        (When::FirstStatement, 1064, "INTERNAL"),
        (When::Login, 1045, "INTERNAL"),
    ]);
    for (when, number, code) in cases {
        let (listener, port) = listener().await;
        let server = tokio::spawn(fake_mysql(listener, when, number));
        let db = backend(&format!("mysql://cellgate@127.0.0.1:{port}/cells")).await;
        let error = ends("ping", db.ping())
            .await
            .expect_err("the server failed");
        let sent = number.to_string();
        assert_error(&format!("{when:?} {number}"), &error, Some(&sent), code);
        server.await.expect("fake server");
    }
}

// Requests in flight when a database stopped answering waited for the
// operating system to give up on the connection.
#[tokio::test]
async fn a_statement_without_an_answer_times_out_and_its_connection_is_closed() {
    for scheme in ["postgres", "mysql"] {
        let (listener, port) = listener().await;
        let server = match scheme {
            "postgres" => tokio::spawn(fake_postgres(listener, When::NotAtAll, "")),
            _ => tokio::spawn(fake_mysql(listener, When::NotAtAll, 0)),
        };
        let db = backend(&format!("{scheme}://cellgate@127.0.0.1:{port}/cells")).await;
        let error = ends("ping", db.ping()).await.expect_err("no answer");
        assert_error(scheme, &error, None, "STORAGE_UNAVAILABLE");
        // The connection is closed, not parked in the pool waiting for an
        // answer to sqlx's ping.
        assert!(
            ends("fake server", server).await.expect("fake server"),
            "{scheme}: the connection that got no answer was kept open"
        );
    }
}

// A database that accepts connections and never answers (a "black hole")
// or refuses them makes requests fail with STORAGE_UNAVAILABLE, not hang.
#[tokio::test]
async fn unreachable_databases_are_storage_unavailable() {
    let (black_hole, port) = listener().await;
    let keep = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = black_hole.accept().await {
            held.push(stream);
        }
    });
    let (closed, closed_port) = listener().await;
    drop(closed);
    for url in [
        format!("postgres://cellgate@127.0.0.1:{port}/cells"),
        format!("mysql://cellgate@127.0.0.1:{port}/cells"),
        format!("postgres://cellgate@127.0.0.1:{closed_port}/cells"),
        format!("mysql://cellgate@127.0.0.1:{closed_port}/cells"),
    ] {
        let db = backend(&url).await;
        let error = ends("ping", db.ping()).await.expect_err("unreachable");
        assert_error(&url, &error, None, "STORAGE_UNAVAILABLE");
        let error = ends("begin", db.begin()).await.err().expect("unreachable");
        assert_error(&url, &error, None, "STORAGE_UNAVAILABLE");
    }
    keep.abort();
}

// A SQLite file that cannot be opened was reported as an internal error.
#[tokio::test]
async fn an_sqlite_file_that_cannot_be_opened_is_storage_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the database file should be.
    let path = dir.path().join("cells.db");
    std::fs::create_dir(&path).unwrap();
    let url = format!("sqlite://{}", path.display());
    let error = match storage::connect(&url, &options()).await {
        Ok(db) => db.ping().await.expect_err("a directory is no database"),
        Err(error) => error,
    };
    assert_error("directory", &error, Some("14"), "STORAGE_UNAVAILABLE");
}

/// `(scheme, url)` of the real servers the environment names.
fn real_servers() -> Vec<(&'static str, String)> {
    let mut servers = Vec::new();
    for (scheme, variable) in [
        ("postgres", "CELLGATE_TEST_POSTGRES_URL"),
        ("mysql", "CELLGATE_TEST_MYSQL_URL"),
    ] {
        match std::env::var(variable) {
            Ok(url) => servers.push((scheme, url)),
            Err(_) => eprintln!("skipped the {scheme} server: {variable} is not set"),
        }
    }
    servers
}

fn raw(dialect: Dialect, text: &str) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push(text);
    sql
}

// A session the server terminates (as on shutdown) was reported as INTERNAL.
#[tokio::test]
async fn a_session_terminated_by_the_server_is_storage_unavailable() {
    for (scheme, url) in real_servers() {
        let db = backend(&url).await;
        let (kill, sent) = match scheme {
            "postgres" => ("SELECT pg_terminate_backend(pg_backend_pid())", "57P01"),
            _ => ("KILL CONNECTION_ID()", "1927"),
        };
        let error = ends("kill", db.execute(&raw(db.dialect(), kill)))
            .await
            .expect_err("the session was killed");
        let sent = (scheme == "postgres" || database_code(&error).is_some()).then_some(sent);
        assert_error(scheme, &error, sent, "STORAGE_UNAVAILABLE");
        // The next request gets a fresh connection.
        ends("ping", db.ping()).await.expect("the server is up");
    }
}

// A statement that takes longer than the timeout fails as unavailable, and
// the pool goes on working.
#[tokio::test]
async fn a_slow_statement_is_cut_off_by_the_timeout() {
    for (scheme, url) in real_servers() {
        let db = backend(&url).await;
        let sleep = match scheme {
            "postgres" => "SELECT pg_sleep(30)",
            _ => "SELECT SLEEP(30)",
        };
        let error = ends("sleep", db.execute(&raw(db.dialect(), sleep)))
            .await
            .expect_err("the timeout cuts it off");
        assert_error(scheme, &error, None, "STORAGE_UNAVAILABLE");
        for _ in 0..4 {
            ends("ping", db.ping()).await.expect("the pool goes on");
        }
    }
}

/// Reads one integer with `sql`.
async fn one_int(db: &dyn Backend, sql: &str) -> cellgate_store::Result<i64> {
    let rows = db
        .fetch(&raw(db.dialect(), sql), &[storage::ColType::Int])
        .await?;
    Ok(rows[0][0].as_int().expect("an integer"))
}

// Pooled connections go back to the pool without a test round trip; one
// left with a rollback queued or a statement abandoned mid-flight must be
// settled before anyone else gets it.
#[tokio::test]
async fn dropped_transactions_and_abandoned_statements_leave_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = real_servers();
    servers.push((
        "sqlite",
        format!("sqlite://{}", dir.path().join("pool.db").display()),
    ));
    for (scheme, url) in servers {
        let db = backend(&url).await;
        let table = format!("pool_probe_{}", std::process::id());
        // The table is made on a connection of its own with a generous
        // timeout: DDL on a busy server may take longer than the 500 ms the
        // rest of the test holds the pool to.
        let setup = storage::connect(
            &url,
            &ConnectOptions {
                statement_timeout: Duration::from_secs(30),
                acquire_timeout: Duration::from_secs(30),
                max_connections: 1,
                ..options()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
        for sql in [
            format!("DROP TABLE IF EXISTS {table}"),
            format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)"),
            format!("INSERT INTO {table} VALUES (1, 0)"),
        ] {
            setup.execute(&raw(setup.dialect(), &sql)).await.unwrap();
        }
        let bump = format!("UPDATE {table} SET v = v + 1 WHERE id = 1");
        for _ in 0..3 {
            // Holds the row's lock, then is dropped without a commit.
            let mut dropped = ends("begin", db.begin()).await.unwrap();
            ends("update", dropped.execute(&raw(db.dialect(), &bump)))
                .await
                .unwrap();
            if scheme == "sqlite" {
                // One writer connection: the next transaction starts after
                // the dropped one is rolled back.
                drop(dropped);
                let mut tx = ends("begin", db.begin()).await.unwrap();
                ends("update", tx.execute(&raw(db.dialect(), &bump)))
                    .await
                    .unwrap();
                ends("commit", tx.commit()).await.unwrap();
                continue;
            }
            // Another transaction, on the pool's other connection, waits
            // for that lock; nobody uses the dropped one's connection
            // again, so only a rollback sent at once lets it through within
            // the statement timeout (500 ms).
            let mut tx = ends("begin", db.begin()).await.unwrap();
            let update = raw(db.dialect(), &bump);
            let (updated, ()) = tokio::join!(tx.execute(&update), async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                drop(dropped);
            });
            updated
                .unwrap_or_else(|e| panic!("{scheme}: the dropped transaction kept its lock: {e}"));
            ends("commit", tx.commit()).await.unwrap();
        }
        let v = one_int(db.as_ref(), &format!("SELECT v FROM {table} WHERE id = 1"))
            .await
            .unwrap();
        assert_eq!(v, 3, "{scheme}: only the committed updates count");

        // Statements abandoned while they run: every later answer is its
        // own, on every connection of the pool.
        if scheme != "sqlite" {
            let slow = match scheme {
                "postgres" => "SELECT 7::bigint FROM (SELECT pg_sleep(0.2)) AS s",
                _ => "SELECT CAST(7 AS SIGNED) FROM (SELECT SLEEP(0.2)) AS s",
            };
            for _ in 0..4 {
                let abandoned =
                    tokio::time::timeout(Duration::from_millis(20), one_int(db.as_ref(), slow))
                        .await;
                assert!(abandoned.is_err(), "{scheme}: the slow statement ran out");
            }
        }
        for n in 0..8 {
            let select = match scheme {
                "postgres" => format!("SELECT {n}::bigint"),
                "mysql" => format!("SELECT CAST({n} AS SIGNED)"),
                _ => format!("SELECT {n}"),
            };
            let answer = ends("select", one_int(db.as_ref(), &select))
                .await
                .unwrap_or_else(|e| panic!("{scheme}: {e}"));
            assert_eq!(answer, n, "{scheme}: an answer of another statement");
        }
        setup
            .execute(&raw(setup.dialect(), &format!("DROP TABLE {table}")))
            .await
            .unwrap();
        setup.close().await;
    }
}
