//! Document bodies: bulk texts (`POST /v1/kbs/{kb}/documents` with a JSON body) and what
//! the node answers for each document it registered. Uploads are multipart and have no
//! body type: their fields are `file`, `external_id` and `metadata` (a JSON object).

use serde::{Deserialize, Serialize};

use crate::JsonMap;

/// `POST /v1/kbs/{kb}/documents`, `Content-Type: application/json`: texts (`documents`) or
/// pages to fetch (`urls`), one of the two.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkDocuments {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub documents: Vec<NewTextDocument>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<NewUrlDocument>,
}

/// One URL of `urls`: a string, or an object with the URL and the fields of a document. The
/// node fetches it (redirects followed, behind its SSRF guard), sniffs the type and parses
/// it as an upload of that type. The external id defaults to the URL, so that posting the URL
/// again makes a new version when the content changed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(from = "UrlEntry")]
pub struct NewUrlDocument {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonMap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<DocumentAccess>,
}

impl NewUrlDocument {
    pub fn url(url: impl Into<String>) -> NewUrlDocument {
        NewUrlDocument {
            url: url.into(),
            ..NewUrlDocument::default()
        }
    }
}

/// What `urls` accepts for one entry.
#[derive(Deserialize)]
#[serde(untagged, expecting = "a URL string or an object with `url`")]
enum UrlEntry {
    Url(String),
    Document(UrlObject),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UrlObject {
    url: String,
    #[serde(default)]
    external_id: Option<String>,
    #[serde(default)]
    metadata: Option<JsonMap>,
    #[serde(default)]
    access: Option<DocumentAccess>,
}

impl From<UrlEntry> for NewUrlDocument {
    fn from(entry: UrlEntry) -> NewUrlDocument {
        match entry {
            UrlEntry::Url(url) => NewUrlDocument::url(url),
            UrlEntry::Document(object) => NewUrlDocument {
                url: object.url,
                external_id: object.external_id,
                metadata: object.metadata,
                access: object.access,
            },
        }
    }
}

/// One document of a bulk text request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTextDocument {
    /// The caller's id; a document with the same one is replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub text: String,
    /// `text` (default), `markdown` or `html`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Values filters can match (`filters.metadata` of a search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<JsonMap>,
    /// Who may read the document; everyone who reaches the KB when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<DocumentAccess>,
}

/// `access` of a document: only keys of one of these groups (and the tenant's admins) read
/// it, in search, chat and every document route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DocumentAccess {
    pub groups: Vec<String>,
}

impl NewTextDocument {
    pub fn text(text: impl Into<String>) -> NewTextDocument {
        NewTextDocument {
            text: text.into(),
            ..NewTextDocument::default()
        }
    }
}

/// One registered document, in the `documents` array of the `202 Accepted` answer (or the
/// whole answer of an upload).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AddedDocument {
    pub id: String,
    pub external_id: Option<String>,
    /// Where ingestion is: `queued` for a new document, the existing one's for a duplicate.
    pub status: String,
    /// The same bytes were already in the KB: `id` is the existing document.
    pub duplicate: bool,
    /// The older version this document replaced (same external id).
    pub replaced: Option<String>,
}
