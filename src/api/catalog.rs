//! `GET /b2b/products`: the active catalog, a page at a time.

use std::sync::Arc;

use actix_web::{web, HttpRequest, HttpResponse};

use super::error::ApiError;
use super::extract::{CatalogRead, Partner};
use super::idempotent::json_response;
use super::lists::{list_body, query_error, ListQuery};
use super::openapi::ProductList;
use super::AppState;
use crate::domain::product::MAX_PRODUCT_ID_LEN;
use crate::views::ProductJson;

#[utoipa::path(
    get, path = "/b2b/products", tag = "account",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "Page size, 1 to 100 (default 50)"), ("cursor" = Option<String>, Query, description = "nextCursor of the previous page")),
    responses((status = 200, description = "Active products in id order", body = ProductList)),
    security(("api_key" = []))
)]
pub async fn products(
    _partner: Partner<CatalogRead>,
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = ListQuery::parse(&req)?;
    // A cursor is the id of the last product of the previous page, so it names a product.
    if let Some(cursor) = &query.cursor {
        if cursor.chars().count() > MAX_PRODUCT_ID_LEN || state.store.product(cursor)?.is_none() {
            return Err(query_error(
                "cursor",
                "cursor is not one this list gave out",
            ));
        }
    }
    let store = Arc::clone(&state.store);
    let page = web::block(move || store.active_products_page(query.cursor.as_deref(), query.limit))
        .await??;
    let items: Vec<ProductJson> = page.items.iter().map(ProductJson::from).collect();
    Ok(json_response(list_body(
        "products",
        items,
        page.next_cursor,
    )))
}
