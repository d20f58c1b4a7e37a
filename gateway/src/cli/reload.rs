//! `cellgate reload`: asks a running gateway to reload its definitions
//! and prints how it went.
//!
//! It sends `POST /admin/reload` to the gateway's own address (with auth on,
//! a token with a `*:admin` scope), so it works wherever the gateway's URL
//! is reachable, across hosts and containers, and reports the outcome
//! (what changed, or the diagnostics of definitions that do not load),
//! which a signal cannot. `kill -HUP <pid>` does the same reload, reported
//! in the gateway's log and `/metrics` only.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

#[derive(Debug, Args)]
pub struct ReloadArgs {
    /// Base URL of the running gateway. [default: http://127.0.0.1:8080]
    #[arg(long, value_name = "URL", env = "CELLGATE_URL")]
    pub url: Option<String>,

    /// API token with a `*:admin` scope, when the gateway has auth on.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "CELLGATE_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,

    /// A plan written by `cellgate plan --format json`: reload only if the
    /// gateway serves the definitions the plan was made from and its
    /// directory holds those it was made for (refused otherwise, nothing
    /// changes).
    #[arg(long, value_name = "FILE", env = "CELLGATE_RELOAD_PLAN")]
    pub plan: Option<std::path::PathBuf>,
}

/// The digests of a plan file, as `POST /admin/reload` takes them.
fn plan_body(path: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the plan `{}`", path.display()))?;
    let plan: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "`{}` is not a plan written by `cellgate plan --format json`",
            path.display()
        )
    })?;
    let digest = |side: &str| {
        plan[format!("{side}_digest")]
            .as_str()
            .map(str::to_string)
            .with_context(|| {
                format!(
                    "`{}` has no `{side}_digest`: write it with `cellgate plan --format json` (version 1)",
                    path.display()
                )
            })
    };
    Ok(serde_json::json!({ "plan": { "base": digest("base")?, "head": digest("head")? } }))
}

pub async fn run(args: ReloadArgs) -> anyhow::Result<ExitCode> {
    let base = args
        .url
        .unwrap_or_else(|| format!("http://{}", crate::config::DEFAULT_LISTEN));
    let url = format!("{}/admin/reload", base.trim_end_matches('/'));
    let body = match &args.plan {
        Some(path) => plan_body(path)?,
        None => serde_json::json!({}),
    };
    let client = reqwest::Client::builder()
        .build()
        .context("cannot create the HTTP client")?;
    let mut request = client
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_string());
    if let Some(token) = &args.token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .with_context(|| format!("cannot reach the gateway at {base}"))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .with_context(|| format!("cannot read the answer of {url}"))?;
    let Ok(answer) = serde_json::from_str::<serde_json::Value>(&text) else {
        anyhow::bail!("{url} answered {status}: {}", text.trim());
    };
    let result = answer["result"].as_str().unwrap_or("unknown");
    let details: Vec<&str> = answer["details"]
        .as_array()
        .map(|d| d.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    match result {
        "applied" => println!("definitions reloaded:"),
        "unchanged" => println!("definitions reloaded: nothing changed"),
        "invalid" => eprintln!("definitions not reloaded, they do not load; the gateway still serves the previous ones:"),
        _ => eprintln!("definitions not reloaded; the gateway still serves the previous ones:"),
    }
    for detail in &details {
        if status.is_success() {
            println!("  {detail}");
        } else {
            eprintln!("{detail}");
        }
    }
    Ok(if status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
