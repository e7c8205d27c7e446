//! What every handler shares on the way out: the storage port as handlers receive it, the
//! callbackUrl policy in force, and the 200 of JSON bytes already rendered.

use actix_web::{web, HttpResponse};

use crate::config::Settings;
use crate::domain::callback_url::AddressPolicy;

/// The storage port, as handlers receive it.
pub(crate) type StoreData = web::Data<dyn crate::store::Store>;

/// Whether callbackUrls may name private hosts (`--allow-private-callbacks`).
pub(crate) fn callback_policy(settings: &Settings) -> AddressPolicy {
    if settings.allow_private_callbacks {
        AddressPolicy::AllowPrivate
    } else {
        AddressPolicy::PublicOnly
    }
}

/// A 200 whose body is JSON bytes already rendered.
pub(crate) fn json_response(body: Vec<u8>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body)
}
