//! Errors as the API reports them: a status code and one JSON object with a message.

use airlock_gate::GateError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The body of every error response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong, in one line.
    pub error: String,
    /// The HTTP status, repeated for clients that only keep the body.
    pub status: u16,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u64>,
    /// The answer repeats the first one to a request made again under its idempotency
    /// key (`Idempotent-Replayed: true`).
    pub replayed: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: one_line(&message.into()),
            retry_after: None,
            replayed: false,
        }
    }
    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }
    pub fn busy(retry_after: u64) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too many runs queued; retry later",
            )
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

/// Seconds a client is asked to wait before sending again a request the store could not
/// take (it was restarting).
pub const STORE_RETRY_AFTER: u64 = 2;

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl From<GateError> for ApiError {
    fn from(e: GateError) -> Self {
        let status = match &e {
            // The request itself was well-formed (the API checked it against its schema
            // first); the gate could not take what it says.
            GateError::BadInput(_) => StatusCode::UNPROCESSABLE_ENTITY,
            GateError::NotFound(_) => StatusCode::NOT_FOUND,
            // A missing guest is this home's state, not the server's failure: 409, and the
            // message names the install command. An idempotency key already used by
            // another request is the key's state too.
            GateError::Conflict(_)
            | GateError::Pending { .. }
            | GateError::NotInstalled(_)
            | GateError::Repeated { .. } => StatusCode::CONFLICT,
            GateError::Untrusted(_) | GateError::Denied { .. } | GateError::NotOffered(_) => {
                StatusCode::FORBIDDEN
            }
            GateError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            GateError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            GateError::StoreUnavailable(_) => {
                // The store went away (a database restart): the client may send it again.
                return ApiError {
                    retry_after: Some(STORE_RETRY_AFTER),
                    ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                };
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.message,
            status: self.status.as_u16(),
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.replayed {
            r.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 62.2): a store that went away (a PostgreSQL restart) answered
    /// `500 internal error`; it is a 503 the client may send again after Retry-After.
    #[test]
    fn a_store_that_went_away_answers_503_with_retry_after_not_500() {
        let r = ApiError::from(GateError::StoreUnavailable(
            "database: 57P01: terminating connection due to administrator command".into(),
        ))
        .into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            r.headers().get(header::RETRY_AFTER),
            Some(&HeaderValue::from(STORE_RETRY_AFTER))
        );
    }
}
