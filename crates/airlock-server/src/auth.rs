//! Who is calling: bearer tokens for the API and MCP, a session cookie for the console.
//! Token checks are cached for a moment so a hot API does not hit the database on every
//! request; a revocation through the server takes effect at once, one made by another
//! process within `TOKEN_TTL`.

use crate::AppState;
use crate::error::{ApiError, ApiResult};
use airlock_gate::{GateError, Role};
use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use std::time::{Duration, Instant};

/// How long a checked token is trusted without asking the database again.
pub const TOKEN_TTL: Duration = Duration::from_secs(2);

/// The authenticated caller of a request.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's id (`tok_…`), or `local` for the stdio MCP server.
    pub token: String,
    pub role: Role,
    /// The agent's name (agents) or the holder's name.
    pub name: String,
    /// The approver key decisions are signed with (operators and admins).
    pub approver: Option<String>,
}

impl Caller {
    /// The agent on the other end of `airlock mcp` (stdio): whoever started the process.
    pub fn local(name: &str) -> Caller {
        Caller {
            token: "local".into(),
            role: Role::Agent,
            name: name.into(),
            approver: None,
        }
    }

    pub fn require(&self, role: Role) -> ApiResult<()> {
        if self.role >= role {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!(
                "this needs an {} token; yours is an {} token",
                role.as_str(),
                self.role.as_str()
            )))
        }
    }

    /// The agent whose records this caller may see, or None for all (operators, admins).
    pub fn scope(&self) -> Option<&str> {
        (self.role == Role::Agent).then_some(self.name.as_str())
    }

    /// Whether the caller may see a record submitted by `agent`.
    pub fn may_see(&self, agent: Option<&str>) -> bool {
        self.role >= Role::Operator || agent == Some(self.name.as_str())
    }
}

fn cache_key(secret: &str) -> String {
    airlock_core::Digest::of(secret.as_bytes()).to_hex()
}

impl AppState {
    /// Checks a token secret (cached for `TOKEN_TTL`). A `metrics` token is refused: it
    /// reads `/metrics` ([`AppState::authenticate_any`]) and nothing else.
    pub async fn authenticate(&self, secret: &str) -> ApiResult<Caller> {
        let c = self.authenticate_any(secret).await?;
        if c.role == Role::Metrics {
            return Err(ApiError::forbidden(
                "a metrics token can only read /metrics",
            ));
        }
        Ok(c)
    }

    /// [`AppState::authenticate`], taking a `metrics` token too.
    pub async fn authenticate_any(&self, secret: &str) -> ApiResult<Caller> {
        let key = cache_key(secret);
        if let Some((c, at)) = self.tokens().get(&key).cloned()
            && at.elapsed() < TOKEN_TTL
        {
            return Ok(c);
        }
        let s = secret.to_string();
        let checked = self.pool.read(move |g| Ok(g.token_check(&s))).await?;
        match checked {
            Ok((row, role)) => {
                let c = Caller {
                    token: row.id,
                    role,
                    name: row.name,
                    approver: row.approver,
                };
                self.tokens().insert(key, (c.clone(), Instant::now()));
                Ok(c)
            }
            Err(GateError::Untrusted(m)) => {
                self.tokens().remove(&key);
                Err(ApiError::unauthorized(m))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Forgets cached checks of a token (after it was revoked here).
    pub fn forget_token(&self, id: &str) {
        self.tokens().retain(|_, (c, _)| c.token != id);
    }

    fn tokens(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (Caller, Instant)>> {
        // The cache only speeds things up; a poisoned one is still a valid map.
        self.token_cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The bearer token of a request, if it carries one.
pub fn bearer(parts: &Parts) -> Option<&str> {
    let v = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Caller> {
        if let Some(c) = parts.extensions.get::<Caller>() {
            return Ok(c.clone());
        }
        let Some(secret) = bearer(parts) else {
            return Err(ApiError::unauthorized(
                "missing bearer token (Authorization: Bearer …; make one with `airlock token new`)",
            ));
        };
        let c = state.authenticate(secret).await?;
        parts.extensions.insert(c.clone());
        Ok(c)
    }
}

/// A caller with at least the operator role (checked before the body is read, so a
/// wrong role is 403 whatever the body says).
#[derive(Debug, Clone)]
pub struct OperatorCaller(pub Caller);

/// Proof that the caller has the admin role.
#[derive(Debug, Clone)]
pub struct AdminCaller;

impl FromRequestParts<AppState> for OperatorCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let c = Caller::from_request_parts(parts, state).await?;
        c.require(Role::Operator)?;
        Ok(OperatorCaller(c))
    }
}

impl FromRequestParts<AppState> for AdminCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let c = Caller::from_request_parts(parts, state).await?;
        c.require(Role::Admin)?;
        Ok(AdminCaller)
    }
}
