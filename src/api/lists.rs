//! The query string of list endpoints: `limit` (1 to 100, default 50) and `cursor`, where a
//! bad value is a 422 located at `["query", name]`.

use crate::domain::ids::{Id, IdKind};
use crate::error::ApiError;
use actix_web::HttpRequest;

use crate::domain::limits::{DEFAULT_PAGE, MAX_PAGE};

pub(crate) struct ListQuery {
    pub(crate) limit: usize,
    pub(crate) cursor: Option<String>,
    pub(crate) params: Vec<(String, String)>,
}

impl ListQuery {
    pub(crate) fn parse(req: &HttpRequest) -> Result<Self, ApiError> {
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
            None => DEFAULT_PAGE,
            Some(text) => Some(text)
                .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|t| t.parse::<usize>().ok())
                .filter(|n| (1..=MAX_PAGE).contains(n))
                .ok_or_else(|| {
                    query_error(
                        "limit",
                        &format!("limit must be a whole number from 1 to {MAX_PAGE}"),
                    )
                })?,
        };
        let cursor = get("cursor").filter(|c| !c.is_empty());
        Ok(ListQuery {
            limit,
            cursor,
            params,
        })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The cursor as an id of `kind`; anything else is a 422.
    pub(crate) fn id_cursor(&self, kind: IdKind) -> Result<Option<Id>, ApiError> {
        self.typed_cursor(|c| Id::parse(kind, c))
    }

    /// The cursor parsed by `parse`; a cursor it refuses is a 422.
    pub(crate) fn typed_cursor<T>(
        &self,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<T>, ApiError> {
        self.cursor
            .as_deref()
            .map(|c| {
                parse(c)
                    .ok_or_else(|| query_error("cursor", "cursor is not one this list gave out"))
            })
            .transpose()
    }
}

pub(crate) fn query_error(name: &str, msg: &str) -> ApiError {
    ApiError::validation(vec!["query".into(), name.into()], msg, "value_error")
}
