//! The accept loop: connections, slow clients and shutdown.
//!
//! poem's `Server` offers neither a header read timeout (hyper has one,
//! but only with a timer poem does not set) nor a cap on connections per
//! client, and its graceful shutdown waits on connections rather than
//! ending them, so the loop is written here on hyper directly, with poem's
//! endpoint as the service:
//!
//! - each connection's request headers must arrive within
//!   `limits.header_timeout_ms` (hyper's `header_read_timeout`), else the
//!   connection is closed;
//! - a client that half-closes the connection after its request (shuts
//!   down its sending side) still gets the answer: the end of its stream
//!   ends the connection only once the answer is out;
//! - at most `limits.max_connections_per_client` connections per peer IP
//!   address (an IPv6 one cut to `limits.client_ipv6_prefix` bits); one more is closed as soon as it is accepted, before any of
//!   its bytes are read;
//! - on shutdown the listener closes, every connection is told to finish
//!   its request in flight and close, and after `limits.shutdown_grace_ms`
//!   the remaining connections are dropped, which cancels their requests.
//!   The bodies of requests are read under their own deadline
//!   (`graphql.rs`), and execution under the request deadline.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use poem::web::{LocalAddr, RemoteAddr};
use poem::Addr;
use poem::{Endpoint, EndpointExt as _, IntoEndpoint};
use tokio::sync::watch;

/// How the server treats connections.
#[derive(Debug, Clone, Copy)]
pub struct ServerOptions {
    pub header_timeout: Duration,
    /// 0: no limit.
    pub max_connections_per_client: usize,
    /// Leading bits of an IPv6 address that name one client
    /// ([`super::client_key`]).
    pub client_ipv6_prefix: u8,
    pub shutdown_grace: Duration,
}

/// Open connections per client address.
#[derive(Default)]
struct Connections {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// Held while a connection is open.
struct ConnectionSlot {
    connections: Arc<Connections>,
    address: IpAddr,
}

impl Connections {
    fn open(self: &Arc<Self>, address: IpAddr, limit: usize) -> Option<ConnectionSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(address).or_insert(0);
        if limit > 0 && *count >= limit {
            return None;
        }
        *count += 1;
        Some(ConnectionSlot {
            connections: self.clone(),
            address,
        })
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

/// Serves `endpoint` on `listener` until `shutdown` resolves, then drains
/// as the module doc says.
pub async fn run<E>(
    listener: tokio::net::TcpListener,
    endpoint: E,
    shutdown: impl std::future::Future<Output = ()>,
    options: ServerOptions,
) -> std::io::Result<()>
where
    E: IntoEndpoint,
    E::Endpoint: 'static,
{
    let endpoint: Arc<dyn poem::endpoint::DynEndpoint<Output = poem::Response>> = Arc::new(
        poem::endpoint::ToDynEndpoint(endpoint.into_endpoint().map_to_response()),
    );
    let local = LocalAddr(Addr::SocketAddr(listener.local_addr()?));
    let connections = Arc::new(Connections::default());
    let (stop, stopped) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off a
                    // little rather than spin.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let client = super::client_key(peer.ip(), options.client_ipv6_prefix);
        let Some(slot) = connections.open(client, options.max_connections_per_client) else {
            tracing::debug!(client = %peer.ip(), "connection refused: too many from this client");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        tasks.spawn(serve_connection(
            stream,
            peer,
            local.clone(),
            endpoint.clone(),
            stopped.clone(),
            slot,
            options,
        ));
        // Reap finished connections so the set does not grow.
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = stop.send(true);
    let drained = tokio::time::timeout(options.shutdown_grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = tasks.len(),
            "shutdown grace period over: closing the remaining connections"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    Ok(())
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    local: LocalAddr,
    endpoint: Arc<dyn poem::endpoint::DynEndpoint<Output = poem::Response>>,
    mut stopped: watch::Receiver<bool>,
    _slot: ConnectionSlot,
    options: ServerOptions,
) {
    let remote = RemoteAddr(Addr::SocketAddr(peer));
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let endpoint = endpoint.clone();
            let request = poem::Request::from((
                request,
                local.clone(),
                remote.clone(),
                poem::http::uri::Scheme::HTTP,
            ));
            async move {
                let response = endpoint.get_response(request).await;
                Ok::<hyper::Response<ResponseBody>, Infallible>(response.into())
            }
        });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client may shut down its sending side once its request is out
    // (`nc -N`, some proxies and scripts) and still wait for the answer.
    // Without `half_close`, hyper takes the end of the stream that arrives
    // while the request runs for an abandoned connection and closes it,
    // answer and all. TCP cannot tell that from a client that went away, so
    // such a request now runs to its end or to its deadline; the answer then
    // finds the connection closed.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout)
        .half_close(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(None);
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => {}
        _ = async { let _ = stopped.wait_for(|stop| *stop).await; } => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}

/// The body type poem's responses convert into.
type ResponseBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::io::Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_per_address_and_released() {
        let connections = Arc::new(Connections::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = connections.open(a, 2).unwrap();
        let _second = connections.open(a, 2).unwrap();
        assert!(connections.open(a, 2).is_none());
        assert!(connections.open(b, 2).is_some());
        drop(first);
        assert!(connections.open(a, 2).is_some());
        assert!(connections.open(a, 0).is_some(), "0 is no limit");
    }
}
