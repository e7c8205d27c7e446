//! `GET /b2b/products`: the active catalog, a page at a time.

use crate::bounds::Deadline;
use actix_web::{HttpRequest, HttpResponse};

use super::extract::{CatalogRead, Partner};
use super::lists::{query_error, ListQuery};
use super::respond::{json_response, StoreData};
use crate::domain::limits::MAX_PRODUCT_ID_LEN;
use crate::error::ApiError;
use crate::views::{to_json, ProductJson, ProductList};

#[utoipa::path(
    get, path = "/b2b/products", tag = "account", summary = "List the active catalog",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "Active products in id order", body = ProductList)),
    security(("api_key" = []))
)]
pub(crate) async fn products(
    _partner: Partner<CatalogRead>,
    req: HttpRequest,
    store: StoreData,
    deadline: Deadline,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(&req)?;
    // A cursor is the id of the last product of the previous page, so it names a product.
    if let Some(cursor) = &query.cursor {
        if cursor.chars().count() > MAX_PRODUCT_ID_LEN
            || store.product(deadline, cursor.clone()).await?.is_none()
        {
            return Err(query_error(
                "cursor",
                "cursor is not one this list gave out",
            ));
        }
    }
    let page = store
        .active_products_page(deadline, query.cursor.clone(), query.limit)
        .await?;
    Ok(json_response(to_json(&ProductList {
        success: true,
        products: page.items.iter().map(ProductJson::from).collect(),
        next_cursor: page.next_cursor.as_deref(),
    })))
}
