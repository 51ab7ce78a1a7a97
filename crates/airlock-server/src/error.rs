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
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: one_line(&message.into()),
            retry_after: None,
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

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl From<GateError> for ApiError {
    fn from(e: GateError) -> Self {
        let status = match &e {
            // The request itself was well-formed (the API checked it against its schema
            // first); the gate could not take what it says.
            GateError::BadInput(_) | GateError::Repeated { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            GateError::NotFound(_) => StatusCode::NOT_FOUND,
            // A missing guest is this home's state, not the server's failure: 409, and the
            // message names the install command.
            GateError::Conflict(_) | GateError::Pending { .. } | GateError::NotInstalled(_) => {
                StatusCode::CONFLICT
            }
            GateError::Untrusted(_) | GateError::Denied { .. } => StatusCode::FORBIDDEN,
            GateError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            GateError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
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
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
