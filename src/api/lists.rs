//! The query string of list endpoints: `limit` (1 to 100, default 50) and `cursor`, where a
//! bad value is a 422 located at `["query", name]`.

use actix_web::HttpRequest;
use serde::Serialize;

use super::error::ApiError;
use crate::domain::ids::{Id, IdKind};

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 100;

pub struct ListQuery {
    pub limit: usize,
    pub cursor: Option<String>,
    pub params: Vec<(String, String)>,
}

impl ListQuery {
    pub fn parse(req: &HttpRequest) -> Result<Self, ApiError> {
        let params: Vec<(String, String)> =
            url::form_urlencoded::parse(req.query_string().as_bytes())
                .into_owned()
                .collect();
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let limit = match get("limit") {
            None => DEFAULT_LIMIT,
            Some(text) => Some(text)
                .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|t| t.parse::<usize>().ok())
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    query_error("limit", "limit must be a whole number from 1 to 100")
                })?,
        };
        let cursor = get("cursor").filter(|c| !c.is_empty());
        Ok(ListQuery {
            limit,
            cursor,
            params,
        })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The cursor as an id of `kind`; anything else is a 422.
    pub fn id_cursor(&self, kind: IdKind) -> Result<Option<Id>, ApiError> {
        self.cursor
            .as_deref()
            .map(|c| {
                Id::parse(kind, c)
                    .ok_or_else(|| query_error("cursor", "cursor is not one this list gave out"))
            })
            .transpose()
    }
}

pub fn query_error(name: &str, msg: &str) -> ApiError {
    ApiError::validation(vec!["query".into(), name.into()], msg, "value_error")
}

/// `{"success":true,"<resource>":[...],"nextCursor":...}`.
pub fn list_body<T: Serialize>(
    resource: &str,
    items: Vec<T>,
    next_cursor: Option<String>,
) -> Vec<u8> {
    let mut body = serde_json::Map::new();
    body.insert("success".into(), true.into());
    body.insert(
        resource.into(),
        serde_json::to_value(items).unwrap_or_default(),
    );
    body.insert("nextCursor".into(), next_cursor.into());
    crate::views::to_json(&body)
}
