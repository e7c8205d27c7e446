//! `GET /console`: the operator's live page (HTML, CSS and a small script embedded in the
//! binary, loaded only from here, under `Content-Security-Policy: default-src 'self'`). It
//! exists only while an admin token is in force, and it is not an API route.

use actix_web::http::header;
use actix_web::{web, HttpResponse};

use crate::config::Settings;
use crate::credentials::Credentials;
use crate::error::ApiError;

const INDEX: &str = include_str!("../console/index.html");
const SCRIPT: &str = include_str!("../console/app.js");
const STYLE: &str = include_str!("../console/app.css");
const ICON: &str = include_str!("../console/favicon.svg");

fn asset(admin: &Credentials, content_type: &str, body: String) -> Result<HttpResponse, ApiError> {
    if !admin.admin_enabled() {
        return Err(ApiError::RouteNotFound);
    }
    Ok(HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((header::CONTENT_SECURITY_POLICY, "default-src 'self'"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(body))
}

pub(crate) async fn page(
    admin: web::Data<Credentials>,
    settings: web::Data<Settings>,
) -> Result<HttpResponse, ApiError> {
    // The currency is a three-letter code checked at start, so it needs no escaping.
    let html = INDEX.replace("{{CURRENCY}}", &settings.currency);
    asset(&admin, "text/html; charset=utf-8", html)
}

pub(crate) async fn script(admin: web::Data<Credentials>) -> Result<HttpResponse, ApiError> {
    asset(&admin, "text/javascript; charset=utf-8", SCRIPT.into())
}

pub(crate) async fn style(admin: web::Data<Credentials>) -> Result<HttpResponse, ApiError> {
    asset(&admin, "text/css; charset=utf-8", STYLE.into())
}

pub(crate) async fn icon(admin: web::Data<Credentials>) -> Result<HttpResponse, ApiError> {
    asset(&admin, "image/svg+xml", ICON.into())
}
