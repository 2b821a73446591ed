//! The body of every error answer: `{ "error": { "code", "message", "type", "param" } }`.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable, stable (`kb_not_found`, `invalid_settings`, ...).
    #[serde(default)]
    pub code: String,
    /// For people; may change between versions.
    #[serde(default)]
    pub message: String,
    /// The class of the error as OpenAI clients know it, from the status alone
    /// ([`error_type`]): `invalid_request_error`, `authentication_error`, ...
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The request field at fault, when one is (`n`, `tools`, `sift.kbs`); else `null`.
    #[serde(default)]
    pub param: Option<String>,
}

impl ErrorBody {
    /// The body of an answer with HTTP status `status`.
    pub fn new(
        status: u16,
        code: impl Into<String>,
        message: impl Into<String>,
        param: Option<String>,
    ) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
                kind: error_type(status).to_string(),
                param,
            },
        }
    }
}

/// The `type` of an error answer with this status, as the OpenAI API names its classes.
pub fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        409 => "conflict_error",
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    }
}
