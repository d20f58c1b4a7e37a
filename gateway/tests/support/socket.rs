//! A `graphql-transport-ws` client for tests of `/graphql/ws`.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
use tokio_tungstenite::tungstenite::Message;

use super::server::Server;

pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens `/graphql/ws` with the `graphql-transport-ws` subprotocol and the
/// extra `headers`; the HTTP status of a refused upgrade.
pub async fn try_connect(server: &Server, headers: &[(&str, &str)]) -> Result<Socket, u16> {
    connect_url(&server.url("/graphql/ws"), headers).await
}

/// [`try_connect`] to the `/graphql/ws` at `url` (`http://…`).
pub async fn connect_url(url: &str, headers: &[(&str, &str)]) -> Result<Socket, u16> {
    let url = url.replacen("http", "ws", 1);
    let mut request = url.into_client_request().expect("request");
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static("graphql-transport-ws"),
    );
    for (name, value) in headers {
        request.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            HeaderValue::from_str(value).expect("header value"),
        );
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, response)) => {
            assert_eq!(
                response
                    .headers()
                    .get("sec-websocket-protocol")
                    .map(|v| v.to_str().unwrap()),
                Some("graphql-transport-ws")
            );
            Ok(socket)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            Err(response.status().as_u16())
        }
        Err(error) => panic!("cannot connect: {error}"),
    }
}

/// Opens `/graphql/ws`; the upgrade must succeed.
pub async fn connect(server: &Server) -> Socket {
    try_connect(server, &[]).await.expect("upgrade accepted")
}

pub async fn send(socket: &mut Socket, message: Value) {
    socket
        .send(Message::text(message.to_string()))
        .await
        .expect("send");
}

/// The next protocol message, or the close code (1006 for a connection
/// lost without one).
pub async fn receive(socket: &mut Socket) -> Result<Value, u16> {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), socket.next())
            .await
            .expect("a message within 20 s");
        match message {
            Some(Ok(Message::Text(text))) => return Ok(serde_json::from_str(&text).unwrap()),
            Some(Ok(Message::Close(frame))) => {
                return Err(frame.map_or(1005, |f| u16::from(f.code)))
            }
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return Err(1006),
        }
    }
}

/// Sends `connection_init` with `payload`: `Ok` on the ack, else the
/// close code.
pub async fn try_init(socket: &mut Socket, payload: Value) -> Result<(), u16> {
    send(
        socket,
        json!({"type": "connection_init", "payload": payload}),
    )
    .await;
    match receive(socket).await? {
        ack if ack == json!({"type": "connection_ack"}) => Ok(()),
        other => panic!("expected connection_ack, got {other}"),
    }
}

/// Sends `connection_init` with `payload` and expects the ack.
pub async fn init(socket: &mut Socket, payload: Value) {
    assert_eq!(try_init(socket, payload).await, Ok(()));
}
