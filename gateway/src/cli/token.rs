//! `cellgate token`: API tokens for `Authorization: Bearer`.
//!
//! `create` prints a new token once (only its hash is stored, in
//! `cellgate_tokens` on the first cluster), `list` shows ids, names,
//! scopes and whether each is revoked, `revoke` ends a token: running
//! gateways stop accepting it within a second (`auth::CACHE_TTL`).
//! `create --no-store` stores nothing and prints the `auth.tokens` entry
//! for the configuration file instead.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::store_args::StoreArgs;
use cellgate_graphql::auth::{tokens, Scopes};

#[derive(Debug, Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token and print it (once: only its hash is kept).
    Create(CreateArgs),
    /// List the stored tokens: id, name, scopes, created, revoked.
    List(ListArgs),
    /// Revoke a stored token by its id (see `list`).
    Revoke(RevokeArgs),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// A scope: `<datastore>:read|write|admin`, `*` for every datastore
    /// (e.g. `trips:read`, `*:admin`). Repeat for several. `admin`
    /// includes `write`, which includes `read`.
    #[arg(
        long = "scope",
        value_name = "SCOPE",
        required = true,
        env = "CELLGATE_TOKEN_SCOPES",
        value_delimiter = ','
    )]
    pub scopes: Vec<String>,
    /// A name to recognise the token by in `list` and the logs.
    #[arg(
        long,
        value_name = "NAME",
        env = "CELLGATE_TOKEN_NAME",
        default_value = ""
    )]
    pub name: String,
    /// Store nothing; print the token and its `auth.tokens` entry for the
    /// configuration file.
    #[arg(long, env = "CELLGATE_TOKEN_NO_STORE", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_store: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The token's id: the 16 hex digits after `cg_`.
    pub id: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub async fn run(args: TokenArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        TokenCommand::Create(args) => create(args).await,
        TokenCommand::List(args) => list(args).await,
        TokenCommand::Revoke(args) => revoke(args).await,
    }
}

async fn create(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let scopes = Scopes::parse(&args.scopes).map_err(|e| anyhow::anyhow!("{e}"))?;
    let token = tokens::generate();
    let name = if args.name.is_empty() {
        token.id.clone()
    } else {
        args.name.clone()
    };
    if args.no_store {
        println!("{}", token.token);
        eprintln!("add to cellgate.yaml:");
        let scopes: Vec<String> = scopes.0.iter().map(|s| format!("\"{s}\"")).collect();
        eprintln!(
            "auth:\n  tokens:\n    - name: {name}\n      hash: \"{}\"\n      scopes: [{}]",
            token.hash,
            scopes.join(", ")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let backend = store.tokens_backend().map_err(|e| anyhow::anyhow!("{e}"))?;
    tokens::insert(backend.as_ref(), &token, &name, &scopes)
        .await
        .map_err(|e| anyhow::anyhow!("cannot store the token: {e}"))?;
    // The token alone on stdout, so that scripts can capture it.
    println!("{}", token.token);
    eprintln!(
        "token {} ({name}) created with scopes {scopes}; it is shown only now",
        token.id
    );
    Ok(ExitCode::SUCCESS)
}

async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let backend = store.tokens_backend().map_err(|e| anyhow::anyhow!("{e}"))?;
    let rows = tokens::list(backend.as_ref())
        .await
        .map_err(|e| anyhow::anyhow!("cannot read the tokens: {e}"))?;
    for row in rows {
        let state = match row.revoked_at {
            Some(at) => format!("revoked {}", at.format("%Y-%m-%dT%H:%M:%SZ")),
            None => "active".to_string(),
        };
        println!(
            "{}\t{}\t{}\tcreated {}\t{state}",
            row.id,
            row.name,
            row.scopes,
            row.created_at.format("%Y-%m-%dT%H:%M:%SZ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn revoke(args: RevokeArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let backend = store.tokens_backend().map_err(|e| anyhow::anyhow!("{e}"))?;
    let id = args.id.trim_start_matches(tokens::TOKEN_PREFIX);
    let id = id.split('_').next().unwrap_or(id);
    if tokens::revoke(backend.as_ref(), id)
        .await
        .map_err(|e| anyhow::anyhow!("cannot revoke the token: {e}"))?
    {
        println!("token {id} revoked");
        Ok(ExitCode::SUCCESS)
    } else {
        anyhow::bail!("no active token with id `{id}`")
    }
}
